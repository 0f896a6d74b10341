"""Accuracy against epsilon, for `fedspeech bench privacy`: user-level DP-FedAvg on a fleet large enough
for it to mean something, simulated in this process.

Each Speech Commands speaker is a device holding its own clips, so the fleet is label-skewed the way
people are: a speaker says a few of the words. Every round each device is taken with probability
`sampling_rate` (Poisson sampling), trains from the global model with the product's own training step and
settings, and the coordinator's own differential privacy around FedAvg (changes bounded in norm, Gaussian
noise, the expected count as denominator) makes the new model. Epsilon at delta comes from dp-accounting.
Each arm is one target epsilon, with the least noise multiplier that keeps the rounds within it; one more
arm bounds without noise (`dp_mean` at no noise), and with a norm bound quantile each epsilon has a second
arm whose bound adapts to it. Every arm samples the same devices each round, so arms differ by their noise
and bound alone. The model is scored on every speaker's held-out clips.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EPSILONS = (4.0, 16.0, 64.0, 256.0, 1024.0)  # the arms: from useless to nearly noiseless, for 200 devices
TARGETS = (1.0, 4.0, 8.0)  # the epsilons whose fleet sizes are reported
RATES = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)  # the sampling rates a fleet size is sought at
DELTA = 1e-5


@dataclass(frozen=True)
class CurvePoint:
    """One arm's run: its noise, the epsilon it spent and the accuracy of its model, every few rounds."""

    noise_multiplier: float  # 0: bounded, no noise
    epsilon: float | None  # None: no guarantee
    accuracy: float  # the last round's model on the held-out clips
    rounds: list[int]
    accuracies: list[float]  # at those rounds
    norm_bound_quantile: float = 0.0  # the quantile the bound adapts to; 0: the setting's fixed bound
    last_norm_bound: float = 0.0  # the last round's bound


@dataclass(frozen=True)
class CurveSetting:
    """The fleet and the rounds every arm runs."""

    devices: int
    clips: int
    sampling_rate: float
    rounds: int
    norm_bound: float
    delta: float = DELTA


def run_curve(
    data_dir: Path,
    epsilons: Sequence[float] = EPSILONS,
    sampling_rate: float = 0.2,
    rounds: int = 30,
    norm_bound: float = 1.0,
    seed: int = 0,
    every: int = 5,
    norm_bound_quantile: float = 0.0,
) -> tuple[CurveSetting, list[CurvePoint]]:
    """Train one arm per epsilon (and one without noise; with a norm bound quantile, one more per epsilon
    whose bound adapts to it) on the Speech Commands speakers as devices.
    """
    import torch

    from fedspeech.coordinator.config import RoundConfig
    from fedspeech.coordinator.privacy.budget import epsilon_spent, noise_multiplier_for
    from fedspeech.coordinator.strategies import Result
    from fedspeech.coordinator.strategies.differential_privacy import (
        DifferentiallyPrivate,
        PrivacySettings,
        dp_mean,
    )
    from fedspeech.coordinator.strategies.fedavg import FedAvg
    from fedspeech.models import build_model
    from fedspeech.models.clips.datasets import (
        client_clips,
        default_spec,
        load_corpus,
        load_waveforms,
        server_test_clips,
        speakers,
    )
    from fedspeech.models.train import get_arrays, predict, set_arrays, train_local

    torch.set_num_threads(2)
    corpus = load_corpus("speech_commands", data_dir)
    spec = default_spec(corpus)
    settings = RoundConfig()
    fleet = []
    for speaker in speakers(corpus):
        train = client_clips(corpus, speaker)[0]
        if train:
            fleet.append(load_waveforms(train, spec.sample_rate, spec.num_samples))
    test_waveforms, test_labels = load_waveforms(
        server_test_clips(corpus), spec.sample_rate, spec.num_samples
    )
    clips = sum(len(labels) for _, labels in fleet)
    setting = CurveSetting(len(fleet), clips, sampling_rate, rounds, norm_bound)
    torch.manual_seed(seed)
    start = get_arrays(build_model(spec))
    net = build_model(spec)

    def accuracy(arrays: dict[str, np.ndarray]) -> float:
        set_arrays(net, arrays)
        probabilities, _ = predict(net, test_waveforms, test_labels)
        return float(np.mean(probabilities.argmax(axis=1) == test_labels))

    noisy = [noise_multiplier_for(e, DELTA, sampling_rate, rounds) for e in epsilons]
    arms = [(0.0, 0.0)] + [(z, 0.0) for z in noisy]
    arms += [(z, norm_bound_quantile) for z in noisy if norm_bound_quantile]
    pool = dict.fromkeys(f"{n:05}" for n in range(len(fleet)))
    points = []
    for z, quantile in arms:
        privacy = PrivacySettings(
            max(z, 0.01), norm_bound, sampling_rate=sampling_rate, norm_bound_quantile=quantile
        )
        strategy = DifferentiallyPrivate(FedAvg(1, 1), privacy)
        current, marks, scores = dict(start), [], []
        for round in range(1, rounds + 1):
            # the same devices each round in every arm
            plan = strategy.configure_round(round, pool, np.random.default_rng([seed, round]))  # type: ignore[arg-type]
            chosen = [int(device) for device in plan.work]
            updates = []
            for n in chosen:
                waveforms, labels = fleet[n]
                set_arrays(net, current)
                train_local(
                    net, waveforms, labels, epochs=settings.epochs, batch_size=settings.batch_size,
                    learning_rate=settings.lr, seed=seed * 1000 + round * 7 + n,
                )  # fmt: skip
                updates.append(get_arrays(net))
            if updates and z:
                results = [Result(str(n), u, 1) for n, u in zip(chosen, updates, strict=True)]
                current = strategy.aggregate(round, results, current)
            elif updates:
                current = dp_mean(
                    current, updates, norm_bound, 0.0, sampling_rate * len(fleet), np.random.default_rng()
                )
            if round % every == 0 or round == rounds:
                marks.append(round)
                scores.append(accuracy(current))
        epsilon = epsilon_spent(z, sampling_rate, rounds, DELTA) if z else None
        points.append(CurvePoint(z, epsilon, scores[-1], marks, scores, quantile, strategy.clip))
        adapting = (
            f", norm bound adapting to the {quantile:g} quantile: {strategy.clip:.3g} at the end"
            if quantile
            else ""
        )
        print(f"noise multiplier {z:.3f}{adapting}: accuracy {scores[-1]:.3f}", flush=True)
    return setting, points


def curve_table(setting: CurveSetting, points: Sequence[CurvePoint]) -> str:
    """The arms as a markdown table."""
    lines = [
        f"accuracy against epsilon: DP-FedAvg simulated in process, {setting.devices} Speech Commands "
        f"speakers as devices ({setting.clips} training clips, label-skewed as spoken), each sampled at "
        f"{setting.sampling_rate:g} a round, {setting.rounds} rounds, changes bounded to norm "
        f"{setting.norm_bound:g}; "
        f"accuracy on every speaker's held-out clips; delta {setting.delta:g}",
        "",
        "| epsilon | noise multiplier | noise on the mean step (z x bound / expected devices) | norm bound "
        "| accuracy |",
        "|---|---|---|---|---|",
    ]
    expected = setting.sampling_rate * setting.devices
    for p in points:
        epsilon = "none (no noise)" if p.epsilon is None else f"{p.epsilon:.3g}"
        bound = f"{setting.norm_bound:g}, fixed"
        if p.norm_bound_quantile:
            bound = f"adapting to the {p.norm_bound_quantile:g} quantile: {p.last_norm_bound:.3g} at the end"
        step = p.noise_multiplier * setting.norm_bound / expected
        lines.append(f"| {epsilon} | {p.noise_multiplier:.3f} | {step:.4f} | {bound} | {p.accuracy:.3f} |")
    return "\n".join(lines)


def fleet_sizes(
    setting: CurveSetting, points: Sequence[CurvePoint], epsilons: Sequence[float] = TARGETS
) -> list[tuple[CurvePoint, list[tuple[int, float]]]]:
    """For each arm with noise, the fleet each epsilon needs to train with that arm's noise on the mean
    step (noise multiplier over expected devices), and so about its accuracy (McMahan et al. 2018's
    argument): at each sampling rate q of RATES, the noise multiplier z the accountant needs for the
    rounds to stay within epsilon, and the devices N = z / (q x the arm's noise); the fewest, with q.
    """
    from fedspeech.coordinator.privacy.budget import noise_multiplier_for

    expected = setting.sampling_rate * setting.devices
    needed = {
        (epsilon, rate): noise_multiplier_for(epsilon, setting.delta, rate, setting.rounds)
        for epsilon in epsilons
        for rate in RATES
    }
    rows = []
    for point in points:
        if point.epsilon is None or point.norm_bound_quantile:  # the fixed bound's arms: their step's noise
            continue
        step = point.noise_multiplier / expected
        rows.append(
            (point, [min((math.ceil(needed[e, q] / (q * step)), q) for q in RATES) for e in epsilons])
        )
    return rows


def sizes_table(
    setting: CurveSetting,
    rows: Sequence[tuple[CurvePoint, list[tuple[int, float]]]],
    epsilons: Sequence[float] = TARGETS,
) -> str:
    """What fleet size each epsilon needs for each arm's accuracy, as a markdown table."""
    expected = setting.sampling_rate * setting.devices
    lines = [
        f"fleet size each epsilon needs: devices for the same noise on the mean step as each arm over "
        f"{setting.rounds} rounds, at the sampling rate that needs the fewest, delta {setting.delta:g}",
        "",
        "| noise on the step | its accuracy | "
        + " | ".join(f"devices for epsilon {e:g}" for e in epsilons)
        + " |",
        "|---|---|" + "---|" * len(epsilons),
    ]
    for point, needs in rows:
        sizes = " | ".join(f"{n:,} (q {q:g})" for n, q in needs)
        lines.append(f"| {point.noise_multiplier / expected:.4f} | {point.accuracy:.3f} | {sizes} |")
    return "\n".join(lines)


def curve_plot(setting: CurveSetting, points: Sequence[CurvePoint], out: Path) -> Path:
    """Accuracy against epsilon (the noiseless arm a dashed line), and each arm's accuracy by round."""
    from fedspeech_bench.report.plots import pyplot

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    noisy = [p for p in points if p.epsilon is not None and not p.norm_bound_quantile]
    adapting = [p for p in points if p.norm_bound_quantile]
    plain = next(p for p in points if p.epsilon is None)
    left.plot(
        [p.epsilon for p in noisy],
        [p.accuracy for p in noisy],
        marker="o",
        label=f"bound {setting.norm_bound:g}",
    )
    if adapting:
        label = f"bound adapting to the {adapting[0].norm_bound_quantile:g} quantile"
        left.plot([p.epsilon for p in adapting], [p.accuracy for p in adapting], marker="s", label=label)
    left.axhline(plain.accuracy, linestyle="--", color="grey", label="bounded, no noise")
    left.set(
        xscale="log", xlabel=f"epsilon at delta {setting.delta:g}", ylabel="held-out accuracy", ylim=(0, 1)
    )
    left.legend()
    for p in points:
        label = "no noise" if p.epsilon is None else f"epsilon {p.epsilon:.3g}"
        label += ", adapting" if p.norm_bound_quantile else ""
        right.plot(p.rounds, p.accuracies, marker=".", label=label)
    right.set(xlabel="round", ylabel="held-out accuracy", ylim=(0, 1))
    right.legend(fontsize=8)
    fig.suptitle(f"DP-FedAvg, {setting.devices} Speech Commands devices sampled at {setting.sampling_rate:g}")
    fig.tight_layout()
    path = out / "accuracy-epsilon.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
