"""`fedspeech bench insiders`: compromised enrolled devices against the coordinator's own rules, in this
process, accuracy by round against the same fleet run clean.

Each FSDD speaker is a device holding its training clips. Every round each device trains from the global
model with the product's own training step and settings; the compromised ones then tamper with what they
send (fleets.poisoning's attacks, or reversed: their change reversed x 1.9 with 100,000 clips claimed,
which they also registered), or train honestly and claim the best hardware (best_hardware). The
coordinator's own rules make the new model: the sample ceiling (influence.sample_ceiling), the norm
bound and the check of directions (influence.bounded) and the strategy's aggregation, wrapped in
differential privacy where an arm asks for it. The arms run the same seeds, so a clean arm repeats bit
for bit and every difference is the attack's. Each arm is also compared with the fleet without its
compromised devices: what no rule can give back is their data. The model is scored on every speaker's
held-out clips.
"""

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

CLAIM = 100_000  # the clips a compromised device registers and claims
REVERSED = -1.9  # "reversed": its change times this, just under the default norm bound (twice the median)
GOOD, BEST = 3.0, 1000.0  # GFLOPS an honest device measures; what a compromised one claims
DP_NOISE = 0.01  # little noise: five devices could learn nothing under more, and the bound is what is tried


@dataclass(frozen=True)
class Arm:
    """One run: the fleet's size, its compromised devices (the last ones), their attack and from when."""

    devices: int
    insiders: int = 0
    attack: str = (
        "none"  # reversed, best_hardware (honest, but its profile says the best), or fleets.poisoning's
    )
    attack_from: int = 1
    strategy: str = "fedavg"
    dp: bool = False  # DP-FedAvg: differential privacy around the strategy, norm bound 1, noise DP_NOISE
    direction_check: bool = True

    @property
    def name(self) -> str:
        """A short label: '1 of 5 reversed from 1, fedavg'."""
        strategy = f"{self.strategy}{' + DP' if self.dp else ''}"
        checked = "" if self.direction_check else ", no direction check"
        if not self.insiders:
            return f"{self.devices} clean, {strategy}{checked}"
        return f"{self.insiders} of {self.devices} {self.attack} from {self.attack_from}, {strategy}{checked}"


@dataclass
class ArmRun:
    """An arm's accuracy after each round, and how often its compromised devices' changes were left out."""

    arm: Arm
    accuracies: list[float] = field(default_factory=list)
    left_out: int = 0


def _tamper(
    attack: str, start: dict[str, np.ndarray], trained: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    from fedspeech.coordinator.strategies.aggregate import stepped
    from fedspeech_bench.fleets.poisoning import tamper

    if attack == "best_hardware":  # it trains honestly and lies in its profile alone
        return trained
    if attack != "reversed":
        return tamper(start, trained, attack)
    return {
        name: (start[name] + REVERSED * (a.astype(np.float64) - start[name])).astype(a.dtype)
        if stepped(name, a)
        else a
        for name, a in trained.items()
    }


def run_arm(arm: Arm, rounds: int, seed: int = 0) -> ArmRun:
    """Train the arm's fleet for the rounds; its accuracy after each."""
    import torch

    from fedspeech.coordinator.config import RoundConfig
    from fedspeech.coordinator.round.influence import (
        SampleLimits,
        Standings,
        bounded,
        fleet_median,
        sample_ceiling,
    )
    from fedspeech.coordinator.strategies import Result, make_strategy
    from fedspeech.coordinator.strategies.differential_privacy import PrivacySettings
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
    from fedspeech.protocol.messages import Profile
    from fedspeech_bench.fleets.poisoning import CLAIMS

    torch.set_num_threads(1)
    corpus = load_corpus("fsdd")
    spec = default_spec(corpus)
    fleet = speakers(corpus)[: arm.devices]
    insiders = set(fleet[arm.devices - arm.insiders :])
    data = {s: load_waveforms(client_clips(corpus, s)[0], spec.sample_rate, spec.num_samples) for s in fleet}
    test = load_waveforms(server_test_clips(corpus), spec.sample_rate, spec.num_samples)
    privacy = PrivacySettings(DP_NOISE, 1.0, sampling_rate=1.0) if arm.dp else None
    config = RoundConfig(
        direction_check=arm.direction_check, dp_noise_multiplier=DP_NOISE if arm.dp else None
    )
    strategy = make_strategy(arm.strategy, arm.devices, config.epochs, None, privacy)
    limits = SampleLimits(config.sample_growth, config.samples_over_median, config.max_device_samples)
    claims = {"reversed": CLAIM, **CLAIMS}
    registered = {
        s: claims.get(arm.attack, len(data[s][1])) if s in insiders else len(data[s][1]) for s in fleet
    }
    torch.manual_seed(seed)
    net = build_model(spec)
    current = get_arrays(build_model(spec))
    counted: dict[str, int] = {}
    standings = Standings()
    run = ArmRun(arm)
    for round in range(1, rounds + 1):
        profiles = {
            s: Profile(4, 1500.0, 2048.0, BEST if s in insiders and arm.attack == "best_hardware" else GOOD)
            for s in fleet
        }
        strategy.configure_round(round, profiles, np.random.default_rng([seed, round]))
        results = []
        median = fleet_median(registered, counted)
        for i, s in enumerate(fleet):
            waveforms, labels = data[s]
            set_arrays(net, current)
            train_local(
                net, waveforms, labels, epochs=config.epochs, batch_size=config.batch_size,
                learning_rate=config.lr, seed=seed * 1000 + round * 7 + i,
            )  # fmt: skip
            arrays, claimed = get_arrays(net), len(labels)
            if s in insiders and round >= arm.attack_from and arm.attack != "none":
                arrays = _tamper(arm.attack, current, arrays)
                claimed = claims.get(arm.attack, claimed)
            most = sample_ceiling(registered[s], counted.get(s), median, limits)
            results.append(Result(s, arrays, min(claimed, most)))
        counted.update({r.device_id: r.num_samples for r in results})
        kept = bounded(round, current, results, config, standings)
        if arm.direction_check and not arm.dp:
            run.left_out += sum(r.device_id in insiders for r in results) - sum(
                r.device_id in insiders for r in kept
            )
        current = strategy.aggregate(round, kept, current)
        set_arrays(net, current)
        probabilities, _ = predict(net, *test)
        run.accuracies.append(float(np.mean(probabilities.argmax(axis=1) == test[1])))
        print(f"{arm.name}: round {round} accuracy {run.accuracies[-1]:.4f}", flush=True)
    return run


def reference(arm: Arm) -> Arm:
    """The same fleet run clean, with the same rules."""
    return Arm(arm.devices, strategy=arm.strategy, dp=arm.dp, direction_check=arm.direction_check)


def without_insiders(arm: Arm) -> Arm:
    """The fleet without the arm's compromised devices, clean: the most any rule can give back."""
    return Arm(
        arm.devices - arm.insiders, strategy=arm.strategy, dp=arm.dp, direction_check=arm.direction_check
    )


DEFAULT_ARMS = [
    Arm(5, 1, "scaled_global"),
    Arm(5, 1, "reversed"),
    Arm(5, 1, "sign_flip"),
    Arm(6, 2, "reversed"),
    Arm(6, 1, "reversed"),
    Arm(5, 1, "reversed", direction_check=False),
    Arm(5, 1, "best_hardware", strategy="hardware"),
    Arm(5, 1, "reversed", dp=True),
]


def run_insiders(
    arms: Sequence[Arm], rounds: int, late_from: int | None = None
) -> list[tuple[ArmRun, ArmRun, ArmRun]]:
    """Each attacked arm beside its clean fleet and its fleet without the compromised devices; with
    late_from, each attack again from that round on.
    """
    attacked = list(arms)
    if late_from is not None:
        attacked += [Arm(**{**asdict(a), "attack_from": late_from}) for a in arms if a.attack != "none"]
    done: dict[Arm, ArmRun] = {}

    def once(arm: Arm) -> ArmRun:
        if arm not in done:
            done[arm] = run_arm(arm, rounds)
        return done[arm]

    return [(once(a), once(reference(a)), once(without_insiders(a))) for a in attacked]


def table(runs: Sequence[tuple[ArmRun, ArmRun, ArmRun]]) -> str:
    """The markdown table: each arm's final and worst round against clean and without its insiders."""
    rows = [
        "| arm | final accuracy | clean | without the insiders | final - clean | worst round - clean "
        "| worst round - without | insiders' changes left out |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for attacked, clean, without in runs:
        a, c, w = (np.asarray(r.accuracies) for r in (attacked, clean, without))
        rows.append(
            f"| {attacked.arm.name} | {a[-1]:.4f} | {c[-1]:.4f} | {w[-1]:.4f} | {a[-1] - c[-1]:+.4f} "
            f"| {float(np.min(a - c)):+.4f} | {float(np.min(a - w)):+.4f} "
            f"| {attacked.left_out} of {len(a) * attacked.arm.insiders} |"
        )
    return "\n".join(rows)


def plot(runs: Sequence[tuple[ArmRun, ArmRun, ArmRun]], path: Path) -> None:
    """Accuracy by round of each arm (red) beside its clean fleet (black) and its fleet without (grey)."""
    from fedspeech_bench.report.plots import pyplot

    plt = pyplot()
    columns = 4
    rows = (len(runs) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3.2 * rows), sharey=True, squeeze=False)
    for ax, (attacked, clean, without) in zip(axes.flat, runs, strict=False):
        x = range(1, len(attacked.accuracies) + 1)
        ax.plot(x, clean.accuracies, color="black", label="clean")
        ax.plot(x, without.accuracies, color="grey", linestyle="--", label="without the insiders")
        ax.plot(x, attacked.accuracies, color="tab:red", label="attacked")
        ax.set_title(attacked.arm.name, fontsize=8)
        ax.set(xlabel="round", ylim=(0, 1))
    axes.flat[0].legend(fontsize=7)
    for ax in list(axes.flat)[len(runs) :]:
        ax.axis("off")
    fig.suptitle("fedspeech bench insiders: held-out accuracy by round")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_insiders(out: Path, runs: Sequence[tuple[ArmRun, ArmRun, ArmRun]]) -> str:
    """results.json, table.md and insiders.png in out; the table."""
    out.mkdir(parents=True, exist_ok=True)
    data = [{"attacked": asdict(a), "clean": asdict(c), "without": asdict(w)} for a, c, w in runs]
    (out / "results.json").write_text(json.dumps(data, indent=1))
    text = table(runs)
    (out / "table.md").write_text(text + "\n")
    plot(runs, out / "insiders.png")
    return text


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `bench insiders` to the `bench` subcommands."""
    p = bench_subparsers.add_parser(
        "insiders",
        help="compromised enrolled devices against the coordinator's rules, simulated in this process",
    )
    p.add_argument("--out", type=Path, default=Path("fedspeech-bench-insiders"), help="where results go")
    p.add_argument("--rounds", type=int, default=12, help="rounds of each arm (default 12)")
    p.add_argument(
        "--late-from", type=int, help="each attack again from this round on, once the model learned"
    )
    p.set_defaults(run=run_from_args)


def run_from_args(args: argparse.Namespace) -> None:
    """`fedspeech bench insiders`: check the options, run every arm, write and print the table."""
    from fedspeech.connection_options import results_folder

    if not 1 <= args.rounds <= 500 or not 1 <= (args.late_from or 1) <= args.rounds:
        raise SystemExit("fedspeech bench insiders: --rounds must be from 1 to 500, --late-from within them")
    results_folder("bench insiders", args.out)
    runs = run_insiders(DEFAULT_ARMS, args.rounds, args.late_from)
    print(write_insiders(args.out, runs))
    print(f"\n{args.out / 'table.md'}, {args.out / 'insiders.png'}, {args.out / 'results.json'}")
