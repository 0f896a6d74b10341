"""Centralised training, the reference every benchmark compares with, and `fedspeech bench central`."""

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedspeech_bench.report.summaries import mean_std
from fedspeech_bench.run_progress import Progress

if TYPE_CHECKING:
    from fedspeech.models.clips.datasets import Clip, Corpus
    from fedspeech.protocol.messages import ModelSpec


Waveforms = tuple[np.ndarray, np.ndarray]  # clips' samples and their labels


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


def load_clips(spec: "ModelSpec", clips: Sequence["Clip"]) -> Waveforms:
    """The clips' waveforms at the spec's rate and length, and their labels."""
    from fedspeech.models.clips.datasets import load_waveforms

    return load_waveforms(list(clips), spec.sample_rate, spec.num_samples)


def train_central(
    spec: "ModelSpec",
    train: Waveforms,
    test: Waveforms,
    seed: int,
    epochs: int,
    threads: int = 2,
) -> CentralScore:
    """Train the spec's model on the waveforms pooled in one place, as the federated runs train; score it.

    The same model, batch size and learning rate as a federated device's round (RoundConfig's); the
    seconds count training and scoring, not loading the clips (load_clips, once for every seed).
    """
    import time

    import torch

    from fedspeech.coordinator.config import RoundConfig
    from fedspeech.models import build_model
    from fedspeech.models.train import evaluate, train_local

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    net = build_model(spec)
    defaults = RoundConfig()
    start = time.perf_counter()
    train_local(
        net,
        *train,
        epochs=epochs,
        batch_size=defaults.batch_size,
        learning_rate=defaults.lr,
        seed=seed,
    )
    result = evaluate(net, *test)
    return CentralScore(result.accuracy, result.macro_f1, time.perf_counter() - start)


def run_central(
    corpus: str,
    out: Path,
    seeds: int,
    epochs: int,
    data_dir: Path | None = None,
    left_out: str | None = None,
) -> Path:
    """`bench central`: centralised training per seed; writes a markdown table and central.json.

    Trained on the union of the speakers' training splits and scored on the union of their test splits,
    with the federated runs' split, model, batch size and learning rate: the gap between the two is the
    price of keeping the clips on the devices. With left_out, the other speakers' training splits train
    and all of that speaker's clips score, as the federated leave-one-speaker-out split does.
    """
    from fedspeech.models.clips.datasets import default_spec, load_corpus

    out.mkdir(parents=True, exist_ok=True)
    data = load_corpus(corpus, data_dir)
    spec = default_spec(data)
    train_clips, test_clips = central_split(data, left_out)
    train, test = load_clips(spec, train_clips), load_clips(spec, test_clips)
    runs = []
    with Progress(seeds) as progress:
        for seed in range(seeds):
            progress.start_run(f"{corpus} central seed {seed}")
            score = train_central(spec, train, test, seed, epochs)
            runs.append(
                CentralRun(
                    corpus,
                    seed,
                    epochs,
                    score.accuracy,
                    score.macro_f1,
                    score.seconds,
                    len(test_clips),
                    left_out,
                )
            )
            progress.end_run()
            progress.say(
                f"{corpus} central seed {seed}: accuracy {runs[-1].accuracy:.4f}, {runs[-1].seconds:.0f} s"
            )
    accuracy = [r.accuracy for r in runs]
    lines = [
        f"### {corpus}: centralised training, {epochs} epochs"
        + ("" if left_out is None else f", speaker {left_out} held out"),
        "",
        "| seed | accuracy | macro-F1 | seconds |",
        "|---|---|---|---|",
        *(f"| {r.seed} | {r.accuracy:.4f} | {r.macro_f1:.4f} | {r.seconds:.0f} |" for r in runs),
        f"| mean | {mean_std(accuracy)} | | |",
    ]
    (out / "central.json").write_text(json.dumps([asdict(r) for r in runs], indent=2))
    path = out / "central.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return path
