"""The benchmarks' plots, as PNGs: accuracy over time and over rounds, bytes moved, held-out speakers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedspeech_bench.report.summaries import Summary, loso_speaker, mean_curve, mean_of

if TYPE_CHECKING:
    from types import ModuleType

    from fedspeech_bench.runs import Run


def pyplot() -> ModuleType:
    """matplotlib.pyplot drawing into files (Agg), imported only when a benchmark plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(corpus: str, runs: Sequence[Run], rows: list[Summary], out: Path) -> list[Path]:
    """Accuracy against wall time (one line per run) and bytes per arm, as PNGs."""
    plt = pyplot()

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


def plot_rounds(split: str, runs: Sequence[Run], out: Path) -> Path:
    """Accuracy over rounds, one line per arm (mean over seeds and folds)."""
    plt = pyplot()
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
    plt = pyplot()

    arms = list(dict.fromkeys(run.arm for run in runs))
    folds = sorted({loso_speaker(run) for run in runs})
    width = 0.8 / len(arms)
    fig, ax = plt.subplots(figsize=(max(8, len(folds) * len(arms) * 0.25), 5))
    x = np.arange(len(folds))
    for i, arm in enumerate(arms):
        heights = []
        for speaker in folds:
            acc = [r.final_accuracy for r in runs if r.arm == arm and loso_speaker(r) == speaker]
            heights.append(mean_of(acc) if acc else 0.0)
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
