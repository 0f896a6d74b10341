"""Benchmarks that train for real: `fedspeech bench strategies` and `fedspeech bench growing`.

Each compares arms (coordinator settings: a strategy, a model and its depth schedule) on the same
emulated fleet, data split and seeds, and reports them against a baseline arm.
"""

import json
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedspeech.coordinator.store import RoundRecord
from fedspeech.coordinator.strategies import STRATEGIES
from fedspeech.fleet_run import attacking_devices, fleet_run
from fedspeech.fleets.fleet_files import (
    DEFAULT_FLEETS,
    FLEETS_DIR,
    DeviceSpec,
    check_fleet,
    hosted_fleet,
    load_fleet,
)
from fedspeech.progress import Progress

log = logging.getLogger(__name__)

DEFAULT_TARGETS = {"fsdd": 0.95, "emodb": 0.5, "speech_commands": 0.5}


@dataclass(frozen=True)
class Arm:
    """One contender: a name, the coordinator settings that make it, and devices that attack it."""

    name: str
    settings: Mapping[str, Any]
    attacks: Mapping[str, str] = field(default_factory=dict)  # speaker -> attack (fleets.poisoning)
    left_out: Sequence[str] = ()  # speakers whose devices do not take part


def strategy_arms(names: Sequence[str], k: int) -> list[Arm]:
    """One arm per strategy, each aggregating k devices where it selects."""
    return [Arm(name, {"STRATEGY": name, "K": k}) for name in names]


# the dynamic transformer: full depth from round 1 against growing a block per stage, and the growing
# one without each of its stabilisers
GROWING_ARMS = [
    Arm("fixed", {"MODEL": "transformer", "DEPTH_SCHEDULE": "constant"}),
    Arm("growing", {"MODEL": "transformer", "DEPTH_SCHEDULE": "linear"}),
    Arm("growing_post_ln", {"MODEL": "transformer_post_ln", "DEPTH_SCHEDULE": "linear"}),
    Arm("growing_unscaled", {"MODEL": "transformer_unscaled", "DEPTH_SCHEDULE": "linear"}),
]


# one of six FSDD devices sends its update's change x100, another its change reversed
POISONING_ATTACKS = {"george": "scale", "lucas": "sign_flip"}
ROBUST_STRATEGIES = ("fedavg", "clipped", "median", "trimmed_mean", "clipped_trimmed_mean")


@dataclass(frozen=True)
class BenchConfig:
    """What to compare, on what, how often."""

    out: Path
    arms: Sequence[Arm]
    baseline: str  # the arm the others are measured against
    title: str = "fedspeech benchmark"
    corpora: Sequence[str] = ("fsdd", "emodb")
    seeds: int = 3
    rounds: int = 20
    data_dir: Path | None = None
    fleets: Mapping[str, list[DeviceSpec]] = field(default_factory=dict)  # default: load DEFAULT_FLEETS
    corpus_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per-corpus extras
    targets: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TARGETS))
    round_timeout_s: float = 120.0
    # the corpus each entry of `corpora` trains on, where the entry is another name (a split, a fold)
    corpus_of: Mapping[str, str] = field(default_factory=dict)

    def fleet(self, corpus: str) -> list[DeviceSpec]:
        """The corpus' emulated fleet."""
        return self.fleets[corpus] if corpus in self.fleets else load_fleet(DEFAULT_FLEETS[corpus])

    def corpus_name(self, corpus: str) -> str:
        """The corpus (and built-in task) an entry of `corpora` trains on."""
        return self.corpus_of.get(corpus, corpus)


def strategies_config(
    out: Path, strategies: Sequence[str] | None = None, k: int = 3, **kw: Any
) -> BenchConfig:
    """`bench strategies`: the strategies named (default: all) on the Pi-mix fleets, against FedAvg."""
    strategies = list(strategies or STRATEGIES)
    unknown = sorted(set(strategies) - set(STRATEGIES))
    if unknown:
        raise ValueError(f"unknown strategies {unknown}, expected some of {', '.join(STRATEGIES)}")
    return BenchConfig(out, strategy_arms(strategies, k), "fedavg", "fedspeech strategy benchmark", **kw)


def growing_config(out: Path, data_dir: Path | None = None, hosts: int = 6, **kw: Any) -> BenchConfig:
    """`bench growing`: fixed-depth against growing transformers, FSDD on pi4-wifi and Speech Commands.

    Speech Commands has a device per speaker with training clips (over 200), hosted `hosts` to a
    process at a Pi 4's 0.25 core each; every round samples 30 of them at random, as the dynamic
    transformer's paper does.
    """
    from fedspeech.models.datasets import client_clips, load_corpus, speakers

    fleets = {"fsdd": load_fleet(FLEETS_DIR / "pi4-wifi.toml")}
    if data_dir is not None:
        corpus = load_corpus("speech_commands", data_dir)
        trainers = [s for s in speakers(corpus) if client_clips(corpus, s)[0]]
        fleets["speech_commands"] = hosted_fleet(trainers, hosts, cpu_share=0.25)
    return BenchConfig(
        out,
        GROWING_ARMS,
        "fixed",
        "fedspeech growing-transformer benchmark",
        corpora=list(fleets),
        data_dir=data_dir,
        fleets=fleets,
        corpus_settings={"speech_commands": {"STRATEGY": "random_k", "K": 30}},
        **kw,
    )


def poisoning_config(out: Path, strategies: Sequence[str] = ROBUST_STRATEGIES, **kw: Any) -> BenchConfig:
    """`bench poisoning`: FedAvg on an honest fleet, against each strategy with two attacking devices.

    FSDD on the pi4-wifi fleet (six devices, one per speaker); in the attacked arms two of its speakers'
    devices are replaced by attackers (POISONING_ATTACKS), which train on the same clips. The
    honest-only arm leaves those two out: the best a defence that ignores them can do.
    """
    unknown = sorted(set(strategies) - set(STRATEGIES))
    if unknown:
        raise ValueError(f"unknown strategies {unknown}, expected some of {', '.join(STRATEGIES)}")
    arms = [
        Arm("clean-fedavg", {"STRATEGY": "fedavg"}),
        Arm("honest-only-fedavg", {"STRATEGY": "fedavg"}, left_out=list(POISONING_ATTACKS)),
    ]
    arms += [Arm(f"attacked-{name}", {"STRATEGY": name}, POISONING_ATTACKS) for name in strategies]
    fleets = {"fsdd": load_fleet(FLEETS_DIR / "pi4-wifi.toml")}
    title = "fedspeech poisoning benchmark"
    return BenchConfig(out, arms, "clean-fedavg", title, corpora=["fsdd"], fleets=fleets, **kw)


@dataclass(frozen=True)
class Run:
    """One training run: its rounds as stored, times counted from t0, the start of its first round."""

    corpus: str
    arm: str
    seed: int
    rounds: list[RoundRecord]
    t0: float

    @property
    def accuracies(self) -> list[float]:
        """Each round's accuracy: pooled over the devices where they evaluated, else the coordinator's."""
        return [_accuracy(r) for r in self.rounds]

    @property
    def final_accuracy(self) -> float:
        """Accuracy of the last global model."""
        return self.accuracies[-1]

    @property
    def wall_s(self) -> float:
        """Seconds from start to the last round's end."""
        return self.rounds[-1].finished_at - self.t0

    @property
    def bytes_total(self) -> int:
        """Bytes up plus bytes down over all rounds."""
        return sum(r.bytes_up + r.bytes_down for r in self.rounds)

    def time_to(self, target: float) -> float | None:
        """Seconds until the global model first reached the target accuracy, or None."""
        return next((r.finished_at - self.t0 for r in self.rounds if _accuracy(r) >= target), None)

    def bytes_to(self, target: float) -> int | None:
        """Bytes up and down until the global model first reached the target accuracy, or None."""
        moved = 0
        for r in self.rounds:
            moved += r.bytes_up + r.bytes_down
            if _accuracy(r) >= target:
                return moved
        return None

    def rounds_to(self, target: float) -> int | None:
        """The first round whose global model reached the target accuracy, or None."""
        return next((r.round for r in self.rounds if _accuracy(r) >= target), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Run":
        """A run back from its dataclasses.asdict form (as results.json holds it)."""
        rounds = [RoundRecord(**record) for record in data["rounds"]]
        return cls(data["corpus"], data["arm"], int(data["seed"]), rounds, float(data["t0"]))


def _accuracy(record: RoundRecord) -> float:
    """A round's accuracy pooled over the devices' test clips where they evaluated, else centrally.

    Devices evaluate only where an arm asks them to: FedBN's personalised models exist only there.
    """
    accuracy = record.federated_accuracy if record.federated_accuracy is not None else record.accuracy
    if accuracy is None:
        raise ValueError(f"round {record.round} has no accuracy: give the run a held-out set")
    return accuracy


def run_once(
    cfg: BenchConfig, corpus: str, arm: Arm, seed: int, on_round: Callable[[int], None] = lambda n: None
) -> Run:
    """Train one arm once on the corpus' fleet, with an embedded broker and throttled devices.

    on_round is called with each round's number as it completes (0: the initial model).
    """
    run_dir = cfg.out / "runs" / f"{corpus}-{arm.name}-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    settings: dict[str, Any] = {
        "ROUNDS": cfg.rounds,
        "ROUND_TIMEOUT_S": cfg.round_timeout_s,
        "MIN_RESULTS": 1,
        "SEED": seed,
    }
    # The corpus' held-out set is the union of the devices' test splits: asking the devices as well
    # would add their evaluation time to every arm and tell nothing new.
    settings["EVAL_EVERY"] = 0
    settings |= {**cfg.corpus_settings.get(corpus, {}), **arm.settings}
    # an attacker replaces the fleet's device of its speaker
    fleet = [s for s in cfg.fleet(corpus) if s.speaker not in arm.attacks and s.speaker not in arm.left_out]
    settings["MIN_DEVICES"] = sum(len(spec.device_ids) for spec in fleet) + len(arm.attacks)
    name = cfg.corpus_name(corpus)
    with (
        fleet_run(fleet, name, run_dir, data_dir=cfg.data_dir, config=settings) as run,
        attacking_devices(arm.attacks, run, name, run_dir, cfg.data_dir),
    ):
        run.wait(cfg.round_timeout_s + 60, lambda record: on_round(record.round))
    rounds = run.service.store.rounds()[1:]
    # Timed from the first round: device start-up (imports, loading data) is the same for every arm.
    return Run(corpus, arm.name, seed, rounds, rounds[0].started_at)


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's t-test p-value and Cohen's d (pooled SD) of a against b; NaN without two values each or spread.

    Runs that all end exactly alike (a model stuck on one class scores the same every seed) give no
    test: the t statistic would be infinite and p a meaningless 0.
    """
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return float("nan"), float("nan")
    pooled = np.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2)
    if not pooled > 0:
        return float("nan"), float("nan")
    p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return p, float((np.mean(a) - np.mean(b)) / pooled)


@dataclass(frozen=True)
class Summary:
    """One arm's runs condensed: accuracy, time and rounds to target, wall time, bytes, p and d."""

    arm: str
    runs: int
    accuracy_mean: float
    accuracy_std: float
    time_to_target_s: float | None  # mean over the runs that reached it
    rounds_to_target: float | None  # likewise
    reached_target: int
    wall_s: float
    bytes_up: float
    bytes_down: float
    p_vs_baseline: float  # Welch's t-test on final accuracy
    d_vs_baseline: float  # Cohen's d on final accuracy
    # to the final accuracy of the baseline's run of the same seed, the way Oort reports time to
    # accuracy: means over the runs that reached it, and how many did
    time_to_baseline_s: float | None = None
    bytes_to_baseline: float | None = None
    reached_baseline: int = 0

    @property
    def bytes_total(self) -> float:
        """Mean bytes up plus down per run."""
        return self.bytes_up + self.bytes_down


def summarize(runs: Sequence[Run], target: float, baseline: str) -> list[Summary]:
    """One summary per arm, in the order the arms first appear."""
    by_arm: dict[str, list[Run]] = {}
    for run in runs:
        by_arm.setdefault(run.arm, []).append(run)
    reference = [r.final_accuracy for r in by_arm.get(baseline, [])]
    baseline_final = {r.seed: r.final_accuracy for r in by_arm.get(baseline, [])}
    summaries = []
    for arm, group in by_arm.items():
        acc = [r.final_accuracy for r in group]
        times = [t for r in group if (t := r.time_to(target)) is not None]
        to_baseline = [
            (t, b)
            for r in group
            if r.seed in baseline_final
            and (t := r.time_to(baseline_final[r.seed])) is not None
            and (b := r.bytes_to(baseline_final[r.seed])) is not None
        ]
        rounds = [n for r in group if (n := r.rounds_to(target)) is not None]
        p, d = welch(acc, reference) if arm != baseline else (float("nan"), float("nan"))
        summaries.append(
            Summary(
                arm=arm,
                runs=len(group),
                accuracy_mean=float(np.mean(acc)),
                accuracy_std=float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0,
                time_to_target_s=float(np.mean(times)) if times else None,
                rounds_to_target=float(np.mean(rounds)) if rounds else None,
                reached_target=len(times),
                wall_s=float(np.mean([r.wall_s for r in group])),
                bytes_up=float(np.mean([sum(x.bytes_up for x in r.rounds) for r in group])),
                bytes_down=float(np.mean([sum(x.bytes_down for x in r.rounds) for r in group])),
                p_vs_baseline=p,
                d_vs_baseline=d,
                time_to_baseline_s=float(np.mean([t for t, _ in to_baseline])) if to_baseline else None,
                bytes_to_baseline=float(np.mean([b for _, b in to_baseline])) if to_baseline else None,
                reached_baseline=len(to_baseline),
            )
        )
    return summaries


def markdown_table(corpus: str, rows: list[Summary], target: float, fleet: str, baseline: str) -> str:
    """The summaries as a markdown table, with time and bytes also as ratios to the baseline."""
    base = next((r for r in rows if r.arm == baseline), None)

    def ratio(value: float | None, of: float | None) -> str:
        return f"{value / of:.2f}x" if value is not None and of else "-"

    lines = [
        f"### {corpus} on {fleet} (target accuracy {target:.2f})",
        "",
        f"| arm | runs | final accuracy | rounds to target | time to target (s) | vs {baseline} | wall (s) "
        f"| vs {baseline} | MB up | MB down | bytes vs {baseline} | p vs {baseline} | d vs {baseline} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        reached = f"({row.reached_target}/{row.runs})"
        rounds = f"{row.rounds_to_target:.1f} {reached}" if row.rounds_to_target is not None else "-"
        time = f"{row.time_to_target_s:.1f} {reached}" if row.time_to_target_s is not None else "not reached"
        accuracy = f"{row.accuracy_mean:.4f} ± {row.accuracy_std:.4f}"
        lines.append(
            f"| {row.arm} | {row.runs} | {accuracy} | {rounds} | {time} "
            f"| {ratio(row.time_to_target_s, base.time_to_target_s if base else None)} | {row.wall_s:.1f} "
            f"| {ratio(row.wall_s, base.wall_s if base else None)} | {row.bytes_up / 1e6:.2f} "
            f"| {row.bytes_down / 1e6:.2f} | {ratio(row.bytes_total, base.bytes_total if base else None)} "
            f"| {row.p_vs_baseline:.3f} | {row.d_vs_baseline:.2f} |"
        )
    if base is None or not rows:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        f"To the final accuracy of {baseline}'s run of the same seed, where the runs reached it:",
        "",
        f"| arm | reached | time (s) | vs {baseline} | MB | vs {baseline} |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        seconds, moved = row.time_to_baseline_s, row.bytes_to_baseline
        lines.append(
            f"| {row.arm} | {row.reached_baseline}/{row.runs} "
            f"| {'-' if seconds is None else f'{seconds:.1f}'} | {ratio(seconds, base.time_to_baseline_s)} "
            f"| {'-' if moved is None else f'{moved / 1e6:.2f}'} | {ratio(moved, base.bytes_to_baseline)} |"
        )
    return "\n".join(lines) + "\n"


def write_plots(corpus: str, runs: Sequence[Run], rows: list[Summary], out: Path) -> list[Path]:
    """Accuracy against wall time (one line per run) and bytes per arm, as PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [r.arm for r in rows]
    colors = {s: plt.cm.tab10(i) for i, s in enumerate(arms)}
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in runs:
        label = run.arm if run.seed == min(r.seed for r in runs if r.arm == run.arm) else None
        elapsed = [r.finished_at - run.t0 for r in run.rounds]
        ax.plot(elapsed, run.accuracies, color=colors[run.arm], alpha=0.7, label=label)
    ax.set(xlabel="wall time (s)", ylabel="held-out accuracy", title=f"{corpus}: accuracy over time")
    ax.grid(alpha=0.3)
    ax.legend()
    accuracy_png = out / f"{corpus}-accuracy.png"
    fig.savefig(accuracy_png, dpi=120, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r.bytes_up / 1e6 for r in rows], 0.4, label="up")
    ax.bar(x + 0.2, [r.bytes_down / 1e6 for r in rows], 0.4, label="down")
    ax.set_xticks(x, arms)
    ax.set(ylabel="MB per run", title=f"{corpus}: bytes moved")
    ax.legend()
    bytes_png = out / f"{corpus}-bytes.png"
    fig.savefig(bytes_png, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return [accuracy_png, bytes_png]


def run_all(cfg: BenchConfig) -> dict[str, list[Run]]:
    """Every arm and seed on every corpus, with a progress line and a result line per run."""
    by_corpus: dict[str, list[Run]] = {corpus: [] for corpus in cfg.corpora}
    with Progress(len(cfg.corpora) * cfg.seeds * len(cfg.arms), cfg.rounds) as progress:
        for corpus in cfg.corpora:
            for seed in range(cfg.seeds):
                for arm in cfg.arms:
                    progress.start_run(f"{corpus} {arm.name} seed {seed}")
                    run = run_once(cfg, corpus, arm, seed, progress.round_done)
                    progress.end_run()
                    by_corpus[corpus].append(run)
                    progress.say(
                        f"{corpus} {arm.name:16s} seed {seed}: accuracy {run.final_accuracy:.4f}, "
                        f"{run.wall_s:.1f} s, {run.bytes_total / 1e6:.1f} MB"
                    )
    return by_corpus


def run_bench(cfg: BenchConfig) -> Path:
    """Run every arm and seed on every corpus; write results.md, results.json and plots."""
    for corpus in cfg.corpora:  # timings only mean something if devices never slow each other down
        check_fleet(cfg.fleet(corpus))
    cfg.out.mkdir(parents=True, exist_ok=True)
    report = [f"# {cfg.title}", ""]
    results = {}
    for corpus, runs in run_all(cfg).items():
        target = cfg.targets[corpus]
        rows = summarize(runs, target, cfg.baseline)
        results[corpus] = {"summaries": [asdict(r) for r in rows], "runs": [asdict(r) for r in runs]}
        fleet = cfg.fleet(corpus)
        fleet_name = f"{len(fleet)} processes, {sum(len(d.device_ids) for d in fleet)} devices"
        report.append(markdown_table(corpus, rows, target, fleet_name, cfg.baseline))
        report += [f"![{p.stem}]({p.name})" for p in write_plots(corpus, runs, rows, cfg.out)] + [""]
    (cfg.out / "results.json").write_text(json.dumps(results, indent=2))
    path = cfg.out / "results.md"
    path.write_text("\n".join(report))
    print(f"wrote {path}, {cfg.out / 'results.json'} and the plots beside them")
    return path
