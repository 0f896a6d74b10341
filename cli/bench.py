"""`fedspeech bench strategies`: every strategy on the same emulated fleet, data split and seeds, compared."""

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from fedspeech.coordinator.store import RoundRecord
from fedspeech.fleet import DEFAULT_FLEETS, check_fleet, load_fleet
from fedspeech.fleet_run import fleet_run

log = logging.getLogger(__name__)

DEFAULT_TARGETS = {"fsdd": 0.95, "emodb": 0.5}


@dataclass(frozen=True)
class BenchConfig:
    """What to compare, on what, how often."""

    out: Path
    corpora: Sequence[str] = ("fsdd", "emodb")
    strategies: Sequence[str] = ("fedavg", "fedprox", "random_k", "hardware", "topk_only", "epochs_only")
    seeds: int = 3
    rounds: int = 20
    k: int = 3
    data_dir: Path | None = None
    fleets: dict[str, Path] = field(default_factory=lambda: dict(DEFAULT_FLEETS))
    targets: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TARGETS))
    round_timeout_s: float = 120.0


@dataclass(frozen=True)
class Run:
    """One training run: its rounds as stored, times counted from t0, the start of its first round."""

    corpus: str
    strategy: str
    seed: int
    rounds: list[RoundRecord]
    t0: float

    @property
    def final_accuracy(self) -> float:
        """Held-out accuracy of the last global model."""
        return self.rounds[-1].accuracy

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
        return next((r.finished_at - self.t0 for r in self.rounds if r.accuracy >= target), None)


def run_once(cfg: BenchConfig, corpus: str, strategy: str, seed: int) -> Run:
    """Train one strategy once on the corpus' fleet, with an embedded broker and throttled devices."""
    run_dir = cfg.out / "runs" / f"{corpus}-{strategy}-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    settings = {"ROUNDS": cfg.rounds, "ROUND_TIMEOUT_S": cfg.round_timeout_s, "MIN_RESULTS": 1}
    settings |= {"STRATEGY": strategy, "K": cfg.k, "SEED": seed}
    with fleet_run(load_fleet(cfg.fleets[corpus]), corpus, run_dir, data_dir=cfg.data_dir, **settings) as run:
        run.wait(cfg.round_timeout_s + 60)
    rounds = run.service.store.rounds()[1:]
    # Timed from the first round: device start-up (imports, loading data) is the same for every strategy.
    return Run(corpus, strategy, seed, rounds, rounds[0].started_at)


def _welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's t-test p-value and Cohen's d (pooled SD) of a against b."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return float("nan"), float("nan")
    p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    pooled = np.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2)
    d = float((np.mean(a) - np.mean(b)) / pooled) if pooled > 0 else float("nan")
    return p, d


@dataclass(frozen=True)
class Summary:
    """One strategy's runs condensed: accuracy, time to target, wall time, bytes, p and d against FedAvg."""

    strategy: str
    runs: int
    accuracy_mean: float
    accuracy_std: float
    time_to_target_s: float | None  # mean over the runs that reached it
    reached_target: int
    wall_s: float
    bytes_up: float
    bytes_down: float
    p_vs_fedavg: float
    d_vs_fedavg: float

    @property
    def bytes_total(self) -> float:
        """Mean bytes up plus down per run."""
        return self.bytes_up + self.bytes_down


def summarize(runs: Sequence[Run], target: float) -> list[Summary]:
    """One summary per strategy, in the order the strategies first appear."""
    by_strategy: dict[str, list[Run]] = {}
    for run in runs:
        by_strategy.setdefault(run.strategy, []).append(run)
    baseline = [r.final_accuracy for r in by_strategy.get("fedavg", [])]
    summaries = []
    for strategy, group in by_strategy.items():
        acc = [r.final_accuracy for r in group]
        reached = [t for r in group if (t := r.time_to(target)) is not None]
        p, d = _welch(acc, baseline) if strategy != "fedavg" else (float("nan"), float("nan"))
        summaries.append(
            Summary(
                strategy=strategy,
                runs=len(group),
                accuracy_mean=float(np.mean(acc)),
                accuracy_std=float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0,
                time_to_target_s=float(np.mean(reached)) if reached else None,
                reached_target=len(reached),
                wall_s=float(np.mean([r.wall_s for r in group])),
                bytes_up=float(np.mean([sum(x.bytes_up for x in r.rounds) for r in group])),
                bytes_down=float(np.mean([sum(x.bytes_down for x in r.rounds) for r in group])),
                p_vs_fedavg=p,
                d_vs_fedavg=d,
            )
        )
    return summaries


def markdown_table(corpus: str, rows: list[Summary], target: float, fleet: Path) -> str:
    """The summaries as a markdown table, with wall time and bytes as ratios to FedAvg."""
    base = next((r for r in rows if r.strategy == "fedavg"), None)
    lines = [
        f"### {corpus} on {fleet.name} (target accuracy {target:.2f})",
        "",
        "| strategy | runs | final accuracy | time to target (s) | wall (s) | wall vs FedAvg "
        "| MB up | MB down | bytes vs FedAvg | p vs FedAvg | d vs FedAvg |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ttt = (
            f"{row.time_to_target_s:.1f} ({row.reached_target}/{row.runs})"
            if row.time_to_target_s is not None
            else f"not reached (0/{row.runs})"
        )
        wall_ratio = f"{row.wall_s / base.wall_s:.2f}x" if base else "-"
        bytes_ratio = f"{row.bytes_total / base.bytes_total:.2f}x" if base and base.bytes_total else "-"
        lines.append(
            f"| {row.strategy} | {row.runs} | {row.accuracy_mean:.4f} ± {row.accuracy_std:.4f} | {ttt} "
            f"| {row.wall_s:.1f} | {wall_ratio} | {row.bytes_up / 1e6:.2f} | {row.bytes_down / 1e6:.2f} "
            f"| {bytes_ratio} | {row.p_vs_fedavg:.3f} | {row.d_vs_fedavg:.2f} |"
        )
    return "\n".join(lines) + "\n"


def write_plots(corpus: str, runs: Sequence[Run], rows: list[Summary], out: Path) -> list[Path]:
    """Accuracy against wall time (one line per run) and bytes per strategy, as PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies = [r.strategy for r in rows]
    colors = {s: plt.cm.tab10(i) for i, s in enumerate(strategies)}
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in runs:
        label = run.strategy if run.seed == min(r.seed for r in runs if r.strategy == run.strategy) else None
        elapsed = [r.finished_at - run.t0 for r in run.rounds]
        ax.plot(elapsed, [r.accuracy for r in run.rounds], color=colors[run.strategy], alpha=0.7, label=label)
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
    ax.set_xticks(x, strategies)
    ax.set(ylabel="MB per run", title=f"{corpus}: bytes moved")
    ax.legend()
    bytes_png = out / f"{corpus}-bytes.png"
    fig.savefig(bytes_png, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return [accuracy_png, bytes_png]


def run_bench(cfg: BenchConfig) -> Path:
    """Run every strategy and seed on every corpus; write results.md, results.json and plots."""
    for corpus in cfg.corpora:  # timings only mean something if devices never slow each other down
        check_fleet(load_fleet(cfg.fleets[corpus]))
    cfg.out.mkdir(parents=True, exist_ok=True)
    report = ["# fedspeech strategy benchmark", ""]
    results = {}
    for corpus in cfg.corpora:
        runs = []
        for seed in range(cfg.seeds):
            for strategy in cfg.strategies:
                run = run_once(cfg, corpus, strategy, seed)
                runs.append(run)
                print(
                    f"{corpus} {strategy:12s} seed {seed}: accuracy {run.final_accuracy:.4f}, "
                    f"{run.wall_s:.1f} s, {run.bytes_total / 1e6:.1f} MB",
                    flush=True,
                )
        target = cfg.targets[corpus]
        rows = summarize(runs, target)
        results[corpus] = {"summaries": [asdict(r) for r in rows], "runs": [asdict(r) for r in runs]}
        report.append(markdown_table(corpus, rows, target, cfg.fleets[corpus]))
        report += [f"![{p.stem}]({p.name})" for p in write_plots(corpus, runs, rows, cfg.out)] + [""]
    (cfg.out / "results.json").write_text(json.dumps(results, indent=2))
    path = cfg.out / "results.md"
    path.write_text("\n".join(report))
    print(f"wrote {path}, {cfg.out / 'results.json'} and the plots beside them")
    return path
