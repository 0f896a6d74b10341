"""Centralised training, the reference every benchmark compares with, and `fedspeech bench central`."""

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedspeech_bench.progress import Progress

if TYPE_CHECKING:
    from fedspeech.models.clips.datasets import Clip, Corpus
    from fedspeech.protocol.messages import ModelSpec


@dataclass(frozen=True)
class CentralRun:
    """The same model trained on every device's training clips pooled in one place, for comparison."""

    corpus: str
    seed: int
    epochs: int
    accuracy: float
    macro_f1: float
    seconds: float
    test_clips: int
    left_out: str | None = None  # the speaker held out, whose clips are the test set


def central_split(corpus: "Corpus", left_out: str | None = None) -> tuple[list["Clip"], list["Clip"]]:
    """(training, test) clips: the within-speaker split, or left_out's clips against the others' training."""
    from fedspeech.models.clips.datasets import leave_one_speaker_out, server_test_clips

    if left_out is None:
        return [c for c in corpus.clips if not c.test], server_test_clips(corpus)
    return leave_one_speaker_out(corpus, left_out)


@dataclass(frozen=True)
class CentralScore:
    """What one centralised training scored on its test clips, and the seconds it took."""

    accuracy: float
    macro_f1: float
    seconds: float


def train_central(
    spec: "ModelSpec",
    train_clips: Sequence["Clip"],
    test_clips: Sequence["Clip"],
    seed: int,
    epochs: int,
    threads: int = 2,
) -> CentralScore:
    """Train the spec's model on the clips pooled in one place, as the federated runs train; score it.

    The same model, batch size and learning rate as a federated device's round (RoundConfig's); the
    seconds count training and scoring, not loading the clips.
    """
    import time

    import torch

    from fedspeech.coordinator.round_config import RoundConfig
    from fedspeech.models import build_model
    from fedspeech.models.clips.datasets import load_waveforms
    from fedspeech.models.train import evaluate, train_local

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    train_x, train_y = load_waveforms(list(train_clips), spec.sample_rate, spec.num_samples)
    test_x, test_y = load_waveforms(list(test_clips), spec.sample_rate, spec.num_samples)
    net = build_model(spec)
    defaults = RoundConfig()
    start = time.perf_counter()
    train_local(
        net,
        train_x,
        train_y,
        epochs=epochs,
        batch_size=defaults.batch_size,
        learning_rate=defaults.learning_rate,
        seed=seed,
    )
    result = evaluate(net, test_x, test_y)
    return CentralScore(result.accuracy, result.macro_f1, time.perf_counter() - start)


def central_run(
    corpus: str,
    seed: int,
    epochs: int,
    data_dir: Path | None = None,
    model: str | None = None,
    threads: int = 2,
    left_out: str | None = None,
) -> CentralRun:
    """Train centrally on the union of the speakers' training splits; score on the union of their test splits.

    The same split, model, batch size and learning rate as the federated runs: the gap between the two
    is the price of keeping the clips on the devices. With left_out, the other speakers' training splits
    train and all of that speaker's clips score, as the federated leave-one-speaker-out split does.
    """
    from fedspeech.models.clips.datasets import default_spec, load_corpus

    data = load_corpus(corpus, data_dir)
    spec = default_spec(data, name=model)
    train_clips, test_clips = central_split(data, left_out)
    score = train_central(spec, train_clips, test_clips, seed, epochs, threads)
    return CentralRun(
        corpus, seed, epochs, score.accuracy, score.macro_f1, score.seconds, len(test_clips), left_out
    )


def run_central(
    corpus: str,
    out: Path,
    seeds: int,
    epochs: int,
    data_dir: Path | None = None,
    left_out: str | None = None,
) -> Path:
    """`bench central`: centralised training per seed; writes a markdown table and central.json."""
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    with Progress(seeds) as progress:
        for seed in range(seeds):
            progress.start_run(f"{corpus} central seed {seed}")
            runs.append(central_run(corpus, seed, epochs, data_dir, left_out=left_out))
            progress.end_run()
            progress.say(
                f"{corpus} central seed {seed}: accuracy {runs[-1].accuracy:.4f}, {runs[-1].seconds:.0f} s"
            )
    accuracy = [r.accuracy for r in runs]
    std = float(np.std(accuracy, ddof=1)) if len(runs) > 1 else 0.0
    lines = [
        f"### {corpus}: centralised training, {epochs} epochs"
        + ("" if left_out is None else f", speaker {left_out} held out"),
        "",
        "| seed | accuracy | macro-F1 | seconds |",
        "|---|---|---|---|",
        *(f"| {r.seed} | {r.accuracy:.4f} | {r.macro_f1:.4f} | {r.seconds:.0f} |" for r in runs),
        f"| mean | {np.mean(accuracy):.4f} ± {std:.4f} | | |",
    ]
    (out / "central.json").write_text(json.dumps([asdict(r) for r in runs], indent=2))
    path = out / "central.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return path
