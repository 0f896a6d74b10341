"""The label-inference attack of `fedspeech bench privacy`: an honest-but-curious coordinator guesses
which labels each device holds from what that device sends it.

The fleet is label-skewed: each device is one FSDD speaker missing `missing` of the ten digits. Every
device trains one round from the same model, with the product's own training step and settings, in this
process. The attacker reads the last layer's bias in what it receives: a label a device trained on pulls
its bias up, a missing one is pushed down (the sign of the last layer's gradient, as in Zhao et al. 2020,
"iDLG", and Wainakh et al. 2022). It guesses "present" where the bias rose. Its accuracy at telling
present from missing labels is scored for three views:
- plain FedAvg: each device's own update;
- secure aggregation, what the coordinator holds of one device: its masked vector, read as an update;
- secure aggregation, the round's sum: the same guess for every device;
- differential privacy at a given noise multiplier, the worst case its guarantee covers: one device's
  change bounded in norm, with the round's whole Gaussian noise on it, as if it were alone in the round.
"Always present" is the baseline an attacker gets without looking.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEAD_BIAS = "head.bias"
MISSING = 4  # digits each device lacks


@dataclass(frozen=True)
class AttackScore:
    """How well the attacker tells present labels from missing ones, from one view of the round."""

    view: str
    accuracy: float
    devices: int
    guesses: int  # devices x labels


def run_attack(
    devices: int = 20,
    missing: int = MISSING,
    seed: int = 0,
    per_label: int = 15,
    noise: Mapping[str, float] | None = None,
    norm_bound: float = 1.0,
) -> list[AttackScore]:
    """Train a label-skewed FSDD fleet for one round in process, then score the attack on each view;
    noise: a name for each noise multiplier whose view under differential privacy is scored, with
    norm_bound.
    """
    import torch

    from fedspeech.coordinator.config import RoundConfig
    from fedspeech.models import build_model
    from fedspeech.models.clips.datasets import (
        client_clips,
        default_spec,
        load_corpus,
        load_waveforms,
        speakers,
    )
    from fedspeech.models.train import get_arrays, set_arrays, train_local

    torch.set_num_threads(2)
    rng = np.random.default_rng(seed)
    corpus = load_corpus("fsdd")
    spec = default_spec(corpus)
    torch.manual_seed(seed)
    start = get_arrays(build_model(spec))
    classes = len(corpus.labels)
    voices = speakers(corpus)
    settings = RoundConfig()
    present = np.ones((devices, classes), dtype=bool)
    changes, norms = [], []
    for n in range(devices):
        present[n, rng.choice(classes, size=missing, replace=False)] = False
        clips = [c for c in client_clips(corpus, voices[n % len(voices)])[0] if present[n, c.label]]
        chosen = [clips[i] for i in rng.permutation(len(clips))][: per_label * (classes - missing)]
        waveforms, labels = load_waveforms(chosen, spec.sample_rate, spec.num_samples)
        net = build_model(spec)
        set_arrays(net, start)
        train_local(
            net, waveforms, labels, epochs=1, batch_size=settings.batch_size,
            learning_rate=settings.lr, seed=seed + n,
        )  # fmt: skip
        trained = get_arrays(net)
        change = trained[HEAD_BIAS].astype(np.float64) - start[HEAD_BIAS]
        changes.append(change[:classes])  # the digits; the model's none class comes after them
        norms.append(np.sqrt(sum(np.sum((trained[k].astype(np.float64) - start[k]) ** 2) for k in start)))
    plain = np.array(changes)
    total = plain.sum(axis=0)
    masked = _masked_biases(plain, rng)
    views = {
        "always present (no attack)": np.ones_like(present),
        "plain FedAvg: each device's update": plain > 0,
        "secure aggregation: each device's masked vector": masked > 0,
        "secure aggregation: the round's sum": np.broadcast_to(total > 0, present.shape),
    }
    bounded = plain * np.minimum(1.0, norm_bound / np.array(norms))[:, None]
    for name, z in (noise or {}).items():
        views[name] = bounded + rng.normal(0.0, z * norm_bound, bounded.shape) > 0
    return [
        AttackScore(view, float(np.mean(guess == present)), devices, present.size)
        for view, guess in views.items()
    ]


def _masked_biases(plain: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each device's bias change as the coordinator holds it under secure aggregation: encoded, masked
    with a self mask and a pairwise mask per other device, and read back as if it were an update.
    """
    from fedspeech.protocol import secure_sum_maths as ss

    devices, classes = plain.shape
    coding = ss.FixedPoint(clip=10.0, devices=devices)
    pairs = [rng.bytes(ss.SEED_BYTES) for _ in range(devices * devices)]
    views = []
    for n in range(devices):
        seeds = {f"d{m:03d}": pairs[min(n, m) * devices + max(n, m)] for m in range(devices) if m != n}
        vector = ss.mask(coding.encode(plain[n]), f"d{n:03d}", rng.bytes(ss.SEED_BYTES), seeds)
        views.append(coding.decode(vector))
    return np.array(views)


def attack_table(scores: list[AttackScore], missing: int) -> str:
    """The attack's scores as a markdown table."""
    first = scores[0]
    lines = [
        f"label inference by an honest-but-curious coordinator: {first.devices} FSDD devices, each missing "
        f"{missing} of 10 digits, one round of local training; {first.guesses} present-or-missing guesses",
        "",
        "| what the coordinator reads | attack accuracy |",
        "|---|---|",
    ]
    lines += [f"| {s.view} | {s.accuracy:.3f} |" for s in scores]
    return "\n".join(lines)


def attack_plot(scores: list[AttackScore], out: Path) -> Path:
    """The attack's accuracy from each view, as bars."""
    from fedspeech_bench.report.plots import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(figsize=(8, 3.5))
    axes.barh([s.view for s in scores][::-1], [s.accuracy for s in scores][::-1])
    axes.axvline(scores[0].accuracy, linestyle="--", color="grey")
    axes.set(xlabel="accuracy at telling a device's present labels from its missing ones", xlim=(0, 1))
    fig.tight_layout()
    path = out / "label-inference.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
