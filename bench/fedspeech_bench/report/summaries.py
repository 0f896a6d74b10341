"""Statistics over benchmark runs: per-arm summaries, Welch's test, means over seeds and folds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedspeech_bench.splits import LOSO_PREFIX

if TYPE_CHECKING:  # the runs are the harness'; it imports the report to report them
    from fedspeech_bench.runs import Run


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


def mean_of(values: Sequence[float]) -> float:
    """The values' arithmetic mean."""
    return sum(values) / len(values)


def _std(values: Sequence[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def mean_std(values: Sequence[float]) -> str:
    """The values' mean ± SD, four decimals."""
    return f"{mean_of(values):.4f} ± {_std(values):.4f}"


def mean_curve(runs: Sequence[Run]) -> list[float]:
    """Accuracy per round, averaged over the runs (up to the shortest run)."""
    length = min(len(run.rounds) for run in runs)
    return [mean_of([run.accuracies[i] for run in runs]) for i in range(length)]


def loso_speaker(run: Run) -> str:
    """The held-out speaker of a LOSO run."""
    return run.corpus.removeprefix(LOSO_PREFIX)


def loso_per_seed(runs: Sequence[Run]) -> dict[str, list[float]]:
    """Each arm's mean final accuracy over the held-out speakers, per seed (seeds with every fold only)."""
    folds = sorted({loso_speaker(run) for run in runs})
    accuracy = {(run.arm, run.seed, loso_speaker(run)): run.final_accuracy for run in runs}
    per_seed: dict[str, list[float]] = {}
    for arm in dict.fromkeys(run.arm for run in runs):
        for seed in sorted({run.seed for run in runs if run.arm == arm}):
            if all((arm, seed, s) in accuracy for s in folds):
                per_seed.setdefault(arm, []).append(mean_of([accuracy[arm, seed, s] for s in folds]))
    return per_seed
