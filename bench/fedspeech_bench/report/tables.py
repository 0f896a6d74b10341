"""The benchmarks' markdown tables and goals: per-arm results, Table 2, held-out speakers, skewed fleet."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedspeech_bench.report.summaries import (
    Summary,
    loso_per_seed,
    loso_speaker,
    mean_curve,
    mean_of,
    mean_std,
    welch,
)

if TYPE_CHECKING:
    from fedspeech_bench.runs import Run

BASELINE = "fedavg"
GROUPED = {"grouped-1": "1", "grouped-2": "2", "grouped-N": "N"}  # FedVMR's Table 2: arm -> G
GOAL_ROUNDS = 15  # the skewed fleet's goal: within GOAL_GAP of centralized training in this many rounds
GOAL_GAP = 0.02


def _ratio(value: float | None, of: float | None) -> str:
    return f"{value / of:.2f}x" if value is not None and of else "-"


def markdown_table(corpus: str, rows: list[Summary], target: float, fleet: str, baseline: str) -> str:
    """The summaries as a markdown table, with time and bytes also as ratios to the baseline."""
    base = next((r for r in rows if r.arm == baseline), None)

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
            f"| {_ratio(row.time_to_target_s, base.time_to_target_s if base else None)} | {row.wall_s:.1f} "
            f"| {_ratio(row.wall_s, base.wall_s if base else None)} | {row.bytes_up / 1e6:.2f} "
            f"| {row.bytes_down / 1e6:.2f} | {_ratio(row.bytes_total, base.bytes_total if base else None)} "
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
            f"| {'-' if seconds is None else f'{seconds:.1f}'} | {_ratio(seconds, base.time_to_baseline_s)} "
            f"| {'-' if moved is None else f'{moved / 1e6:.2f}'} | {_ratio(moved, base.bytes_to_baseline)} |"
        )
    return "\n".join(lines) + "\n"


def table2(split: str, rows: Sequence[Summary], target: float) -> str:
    """FedVMR's Table 2 on this fleet: rounds and wall time to the target for G = 1, 2, N side by side."""
    picked = [row for row in rows if row.arm in GROUPED]
    if not picked:
        return ""
    ref = next((row for row in picked if row.arm == "grouped-N"), None)

    lines = [
        f"### {split}: grouped sequential training, G = 1, 2, N (target accuracy {target:.2f})",
        "",
        "| G | arm | final accuracy | rounds to target | vs G=N | time to target (s) | vs G=N | wall (s) "
        "| vs G=N |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(picked, key=lambda r: list(GROUPED).index(r.arm)):
        reached = f"({row.reached_target}/{row.runs})"
        rounds = (
            f"{row.rounds_to_target:.1f} {reached}" if row.rounds_to_target is not None else "not reached"
        )
        time = f"{row.time_to_target_s:.1f} {reached}" if row.time_to_target_s is not None else "not reached"
        lines.append(
            f"| {GROUPED[row.arm]} | {row.arm} | {row.accuracy_mean:.4f} ± {row.accuracy_std:.4f} | {rounds} "
            f"| {_ratio(row.rounds_to_target, ref.rounds_to_target if ref else None)} | {time} "
            f"| {_ratio(row.time_to_target_s, ref.time_to_target_s if ref else None)} | {row.wall_s:.1f} "
            f"| {_ratio(row.wall_s, ref.wall_s if ref else None)} |"
        )
    return "\n".join(lines) + "\n"


def loso_table(runs: Sequence[Run], baseline: str = BASELINE) -> str:
    """Speaker x arm final accuracy (mean over seeds), the mean row, and p and d against the baseline.

    p and d compare each arm's per-seed mean over the speakers with the baseline's (Welch's t-test,
    Cohen's d), as summaries.summarize does for final accuracy.
    """
    arms = list(dict.fromkeys(run.arm for run in runs))
    folds = sorted({loso_speaker(run) for run in runs})
    lines = [
        "### emodb-loso: accuracy on each held-out speaker (mean over seeds)",
        "",
        "| held-out speaker | " + " | ".join(arms) + " |",
        "|---" * (len(arms) + 1) + "|",
    ]
    for speaker in folds:
        cells = []
        for arm in arms:
            acc = [r.final_accuracy for r in runs if r.arm == arm and loso_speaker(r) == speaker]
            cells.append(f"{mean_of(acc):.4f}" if acc else "-")
        lines.append(f"| {speaker} | " + " | ".join(cells) + " |")
    per_seed = loso_per_seed(runs)
    reference = per_seed.get(baseline, [])
    mean_cells, p_cells, d_cells = [], [], []
    for arm in arms:
        values = per_seed.get(arm, [])
        mean_cells.append(f"{mean_std(values)} ({len(values)})" if values else "-")
        p, d = welch(values, reference) if arm != baseline else (float("nan"), float("nan"))
        p_cells.append(f"{p:.3f}")
        d_cells.append(f"{d:.2f}")
    lines += [
        "| mean (± SD over seeds, seeds) | " + " | ".join(mean_cells) + " |",
        f"| p vs {baseline} | " + " | ".join(p_cells) + " |",
        f"| d vs {baseline} | " + " | ".join(d_cells) + " |",
    ]
    return "\n".join(lines) + "\n"


def skewed_goal(runs: Sequence[Run], central: Sequence[float]) -> str:
    """Per arm: the first round its seed-mean accuracy is within GOAL_GAP of centralized training."""
    threshold = mean_of(central) - GOAL_GAP
    lines = [
        f"### speech-commands-skewed: reaching centralized training less {GOAL_GAP * 100:.0f} points "
        f"({threshold:.4f}) in at most {GOAL_ROUNDS} rounds",
        "",
        "| arm | best seed-mean accuracy | first round there (seed mean) | runs reaching it | met |",
        "|---|---|---|---|---|",
    ]
    for arm in dict.fromkeys(run.arm for run in runs):
        group = [run for run in runs if run.arm == arm]
        curve = mean_curve(group)
        first = next((i + 1 for i, acc in enumerate(curve) if acc >= threshold), None)
        reached = sum(run.rounds_to(threshold) is not None for run in group)
        met = "yes" if first is not None and first <= GOAL_ROUNDS else "no"
        lines.append(
            f"| {arm} | {max(curve):.4f} | {first if first is not None else '-'} | {reached}/{len(group)} "
            f"| {met} |"
        )
    return "\n".join(lines) + "\n"


def loso_goal(runs: Sequence[Run], baseline: str = BASELINE) -> str:
    """Which arms beat the baseline's LOSO mean accuracy by 2 points or more with p < 0.05 over seeds."""
    per_seed = loso_per_seed(runs)
    reference = per_seed.get(baseline)
    if not reference:
        return f"emodb-loso goal: no complete {baseline} runs to compare with.\n"
    winners = []
    for arm, values in per_seed.items():
        gain = mean_of(values) - mean_of(reference)
        p, _ = welch(values, reference)
        if arm != baseline and gain >= 0.02 and p < 0.05:
            winners.append(f"{arm} (+{gain * 100:.1f} points, p = {p:.3f})")
    verdict = ", ".join(winners) if winners else "none"
    return f"emodb-loso goal (an arm beats {baseline} by >= 2 points with p < 0.05): {verdict}\n"


def personalised_line(runs: Sequence[Run]) -> str:
    """FedBN's personalised models (the devices' own scores) next to its global model, on the same clips."""
    pairs = [
        (r.rounds[-1].federated_accuracy, r.rounds[-1].accuracy)
        for r in runs
        if r.arm == "fedbn"
        and r.rounds[-1].federated_accuracy is not None
        and r.rounds[-1].accuracy is not None
    ]
    if not pairs:
        return ""
    personal, global_ = (float(np.mean(values)) for values in zip(*pairs, strict=True))
    return (
        f"FedBN after the last round, mean of {len(pairs)} runs: the devices' personalised models (their own "
        f"normalisation layers) {personal:.4f} on their test clips; the exported global model (the initial "
        f"normalisation layers) {global_:.4f} on the same clips.\n"
    )
