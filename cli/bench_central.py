"""`fedspeech bench central`: the model trained on every device's clips pooled, for comparison."""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fedspeech.progress import Progress


@dataclass(frozen=True)
class CentralRun:
    """The same model trained on every device's training clips pooled in one place, for comparison."""

    corpus: str
    seed: int
    epochs: int
    accuracy: float
    macro_f1: float
    seconds: float


def central_run(
    corpus: str,
    seed: int,
    epochs: int,
    data_dir: Path | None = None,
    model: str | None = None,
    threads: int = 2,
) -> CentralRun:
    """Train centrally on the union of the speakers' training splits; score on the union of their test splits.

    The same split, model, batch size and learning rate as the federated runs: the gap between the two
    is the price of keeping the clips on the devices.
    """
    import time

    import torch

    from fedspeech.coordinator.round_config import RoundConfig
    from fedspeech.models import build_model
    from fedspeech.models.datasets import default_spec, load_corpus, load_waveforms, server_test_clips
    from fedspeech.models.train import evaluate, train_local

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    data = load_corpus(corpus, data_dir)
    spec = default_spec(data, name=model)
    train = load_waveforms([c for c in data.clips if not c.test], spec.sample_rate, spec.num_samples)
    test = load_waveforms(server_test_clips(data), spec.sample_rate, spec.num_samples)
    net = build_model(spec)
    start = time.perf_counter()
    defaults = RoundConfig()
    train_local(
        net,
        *train,
        epochs=epochs,
        batch_size=defaults.batch_size,
        learning_rate=defaults.learning_rate,
        seed=seed,
    )
    result = evaluate(net, *test)
    return CentralRun(corpus, seed, epochs, result.accuracy, result.macro_f1, time.perf_counter() - start)


def run_central(corpus: str, out: Path, seeds: int, epochs: int, data_dir: Path | None = None) -> Path:
    """`bench central`: centralised training per seed; writes a markdown table and central.json."""
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    with Progress(seeds) as progress:
        for seed in range(seeds):
            progress.start_run(f"{corpus} central seed {seed}")
            runs.append(central_run(corpus, seed, epochs, data_dir))
            progress.end_run()
            progress.say(
                f"{corpus} central seed {seed}: accuracy {runs[-1].accuracy:.4f}, {runs[-1].seconds:.0f} s"
            )
    accuracy = [r.accuracy for r in runs]
    std = float(np.std(accuracy, ddof=1)) if len(runs) > 1 else 0.0
    lines = [
        f"### {corpus}: centralised training, {epochs} epochs",
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
