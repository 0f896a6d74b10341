"""The seeds benchmark's own tables, goals and plots: Table 2, leave-one-speaker-out, the skewed fleet's goal.

The per-split tables are bench_report.markdown_table's; these are what only this benchmark reports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedspeech.bench_splits import LOSO_PREFIX, SPLIT_CORPUS, label_counts_table

if TYPE_CHECKING:
    from fedspeech.bench import Run
    from fedspeech.bench_report import Summary
    from fedspeech.bench_seeds import Results, SeedsConfig
    from fedspeech.bench_splits import Setting, SkewedDeal

BASELINE = "fedavg"
GROUPED = {"grouped-1": "1", "grouped-2": "2", "grouped-N": "N"}  # FedVMR's Table 2: arm -> G
GOAL_ROUNDS = 15  # the skewed fleet's goal: within GOAL_GAP of centralized training in this many rounds
GOAL_GAP = 0.02
# Targets for rounds and time to target. The within-speaker splits use bench.DEFAULT_TARGETS; LOSO uses
# EmoDB's (the same task, the same bar); the skewed fleet the 0.82 FedAvg needed 21 rounds for in the
# issue that asked for this bench.
LOSO_TARGET = 0.5
SKEWED_TARGET = 0.82


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _std(values: Sequence[float]) -> float:
    import numpy as np

    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def mean_std(values: Sequence[float]) -> str:
    """The values' mean ± SD, four decimals."""
    return f"{_mean(values):.4f} ± {_std(values):.4f}"


def table2(split: str, rows: Sequence[Summary], target: float) -> str:
    """FedVMR's Table 2 on this fleet: rounds and wall time to the target for G = 1, 2, N side by side."""
    picked = [row for row in rows if row.arm in GROUPED]
    if not picked:
        return ""
    ref = next((row for row in picked if row.arm == "grouped-N"), None)

    def ratio(value: float | None, of: float | None) -> str:
        return f"{value / of:.2f}x" if value is not None and of else "-"

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
            f"| {ratio(row.rounds_to_target, ref.rounds_to_target if ref else None)} | {time} "
            f"| {ratio(row.time_to_target_s, ref.time_to_target_s if ref else None)} | {row.wall_s:.1f} "
            f"| {ratio(row.wall_s, ref.wall_s if ref else None)} |"
        )
    return "\n".join(lines) + "\n"


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
                per_seed.setdefault(arm, []).append(_mean([accuracy[arm, seed, s] for s in folds]))
    return per_seed


def loso_table(runs: Sequence[Run], baseline: str = BASELINE) -> str:
    """Speaker x arm final accuracy (mean over seeds), the mean row, and p and d against the baseline.

    p and d compare each arm's per-seed mean over the speakers with the baseline's (Welch's t-test,
    Cohen's d), as bench_report.summarize does for final accuracy.
    """
    from fedspeech.bench_report import welch

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
            cells.append(f"{_mean(acc):.4f}" if acc else "-")
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


def mean_curve(runs: Sequence[Run]) -> list[float]:
    """Accuracy per round, averaged over the runs (up to the shortest run)."""
    length = min(len(run.rounds) for run in runs)
    return [_mean([run.accuracies[i] for run in runs]) for i in range(length)]


def skewed_goal(runs: Sequence[Run], central: Sequence[float]) -> str:
    """Per arm: the first round its seed-mean accuracy is within GOAL_GAP of centralized training."""
    threshold = _mean(central) - GOAL_GAP
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
    from fedspeech.bench_report import welch

    per_seed = loso_per_seed(runs)
    reference = per_seed.get(baseline)
    if not reference:
        return f"emodb-loso goal: no complete {baseline} runs to compare with.\n"
    winners = []
    for arm, values in per_seed.items():
        gain = _mean(values) - _mean(reference)
        p, _ = welch(values, reference)
        if arm != baseline and gain >= 0.02 and p < 0.05:
            winners.append(f"{arm} (+{gain * 100:.1f} points, p = {p:.3f})")
    verdict = ", ".join(winners) if winners else "none"
    return f"emodb-loso goal (an arm beats {baseline} by >= 2 points with p < 0.05): {verdict}\n"


def plot_rounds(split: str, runs: Sequence[Run], out: Path) -> Path:
    """Accuracy over rounds, one line per arm (mean over seeds and folds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 5))
    for arm in dict.fromkeys(run.arm for run in runs):
        curve = mean_curve([run for run in runs if run.arm == arm])
        ax.plot(range(1, len(curve) + 1), curve, marker=".", label=arm)
    ax.set(xlabel="round", ylabel="accuracy", title=f"{split}: accuracy over rounds (mean over runs)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    path = out / f"{split}-rounds.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_loso(runs: Sequence[Run], out: Path) -> Path:
    """Bars of each held-out speaker's accuracy, one per arm (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    arms = list(dict.fromkeys(run.arm for run in runs))
    folds = sorted({loso_speaker(run) for run in runs})
    width = 0.8 / len(arms)
    fig, ax = plt.subplots(figsize=(max(8, len(folds) * len(arms) * 0.25), 5))
    x = np.arange(len(folds))
    for i, arm in enumerate(arms):
        heights = []
        for speaker in folds:
            acc = [r.final_accuracy for r in runs if r.arm == arm and loso_speaker(r) == speaker]
            heights.append(_mean(acc) if acc else 0.0)
        ax.bar(x + (i - (len(arms) - 1) / 2) * width, heights, width, label=arm)
    ax.set_xticks(x, folds)
    ax.set(
        xlabel="held-out speaker", ylabel="final accuracy", title="emodb-loso: accuracy per held-out speaker"
    )
    ax.legend(fontsize="small", ncol=2)
    path = out / "emodb-loso-speakers.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def personalised_line(runs: Sequence[Run]) -> str:
    """FedBN's personalised models (the devices' own scores) next to its global model, on the same clips."""
    import numpy as np

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


def target_of(split: str) -> float:
    """The accuracy whose rounds and time to reach are reported for a split."""
    from fedspeech.bench import DEFAULT_TARGETS

    if split == "emodb-loso":
        return LOSO_TARGET
    if split == "speech-commands-skewed":
        return SKEWED_TARGET
    return DEFAULT_TARGETS[SPLIT_CORPUS[split]]


def write_report(
    cfg: SeedsConfig, settings: Mapping[str, list[Setting]], deal: SkewedDeal | None, results: Results
) -> Path:
    """results.md (a table per split, LOSO per speaker, Table 2, the goals), results.json and PNGs."""
    from fedspeech.bench_report import markdown_table, summarize, write_plots

    report = [
        "# fedspeech seed-methods benchmark",
        "",
        f"{cfg.seeds} seeds x {cfg.rounds} rounds; arms: {', '.join(cfg.arms)}; baseline {BASELINE}.",
        "",
    ]
    data: dict[str, Any] = {}
    for split in cfg.splits:
        runs = results.runs[split]
        if not runs:
            report += [f"### {split}: no completed runs", ""]
            continue
        target = target_of(split)
        rows = summarize(runs, target, BASELINE)
        fleet = settings[split][0].fleet
        described = f"{len(fleet)} devices" + (
            f", one speaker held out per fold ({len(settings[split])} folds; a run per fold and seed)"
            if split == "emodb-loso"
            else ""
        )
        report.append(markdown_table(split, rows, target, described, BASELINE))
        if split == "emodb-loso":
            report += [
                loso_table(runs),
                loso_goal(runs),
                f"![emodb-loso-speakers]({plot_loso(runs, cfg.out).name})",
            ]
        else:
            report += [f"![{p.stem}]({p.name})" for p in write_plots(split, runs, rows, cfg.out)]
        if split == "speech-commands-skewed" and deal is not None:
            report += [
                "",
                "Clips per device and label (rule: bench_splits.skewed_deal):",
                "",
                label_counts_table(deal),
            ]
            if results.central:
                accuracy = [c.accuracy for c in results.central]
                report += [
                    f"Centralized training of the same CNN on the pooled training clips, "
                    f"{results.central[0].epochs} epochs: accuracy "
                    f"{mean_std(accuracy)} over {len(accuracy)} seeds.",
                    "",
                    skewed_goal(runs, accuracy),
                ]
        report += [
            personalised_line(runs),
            table2(split, rows, target),
            f"![{split}-rounds]({plot_rounds(split, runs, cfg.out).name})",
            "",
        ]
        data[split] = {"summaries": [asdict(r) for r in rows], "runs": [asdict(r) for r in runs]}
    if results.failures:
        report += ["### Failed runs", "", *(f"- {failure}" for failure in results.failures), ""]
    data["central"] = [asdict(c) for c in results.central]
    data["failures"] = results.failures
    (cfg.out / "results.json").write_text(json.dumps(data, indent=2))
    path = cfg.out / "results.md"
    path.write_text("\n".join(report))
    print(f"wrote {path}, {cfg.out / 'results.json'} and the plots beside them")
    return path
