"""What `fedspeech bench strategies` and `growing` report: per-arm summaries, the table, the plots."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the runs are bench's; bench imports this module to report them
    from fedspeech.bench import Run


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
