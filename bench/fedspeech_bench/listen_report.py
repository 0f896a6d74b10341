"""`fedspeech bench listen`'s results: a model's score in one condition, and how they are reported (a line
each as it runs, a markdown table, bar charts, JSON).
"""

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedspeech.runtime.streaming import Detection
from fedspeech_bench.listen_streams import Stream
from fedspeech_bench.word_alignment import Alignment


@dataclass(frozen=True)
class ConditionScore:
    """One model in one condition: the words spoken, what it detected and how they align."""

    condition: str
    words: int
    minutes: float
    alignment: Alignment
    detections: list[Detection]
    seconds: float  # wall time to hear it
    others: int = 0  # words said that are none of the task's: every detection is false

    @property
    def false_per_hour(self) -> float | None:
        """Detections per hour of a stream without words (all false); None when words were spoken."""
        return false_per_hour(self) if self.words == 0 and not self.others else None


def summary(result: ConditionScore) -> str:
    """One line of what a result says."""
    a = result.alignment
    if result.others:
        return (
            f"{a.insertions} of {result.others} other words detected ({percent(a.insertions, result.others)})"
        )
    if result.words == 0:
        return (
            f"{a.insertions} false detections in {result.minutes:.1f} min ({result.false_per_hour:.1f}/hour)"
        )
    return (
        f"{a.hits}/{result.words} detected in order, {a.wrong_or_extra} wrong or extra, {a.deletions} missed"
    )


def percent(count: int, words: int) -> str:
    """count as a percentage of words."""
    return f"{100 * count / words:.1f}%"


def table(name: str, path: Path, results: Sequence[ConditionScore]) -> str:
    """One model's markdown table."""
    lines = [
        f"### {name} ({path})",
        "",
        "| condition | words | detected in order | wrong or extra | misses | false detections/hour |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        a = r.alignment
        if r.others:
            detected = f"{a.insertions} of {r.others} other words ({percent(a.insertions, r.others)})"
            lines.append(f"| {r.condition} | - | - | - | - | {detected} |")
        elif r.words == 0:
            lines.append(f"| {r.condition} ({r.minutes:.1f} min) | - | - | - | - | {r.false_per_hour:.1f} |")
        else:
            lines.append(
                f"| {r.condition} | {r.words} | {percent(a.hits, r.words)} ({a.hits}) "
                f"| {a.wrong_or_extra} ({percent(a.wrong_or_extra, r.words)}) | {a.deletions} | - |"
            )
    return "\n".join(lines) + "\n"


def plot(runs: dict[str, list[ConditionScore]], out: Path) -> list[Path]:
    """Detected in order and wrong or extra (% of words) per condition with words, and false detections per
    hour per condition without; a bar per model.
    """
    first = next(iter(runs.values()))  # the conditions are the same for every model
    spoken = [r.condition for r in first if r.words]
    unspoken = [r.condition for r in first if not r.words and not r.others]
    others = [r.condition for r in first if r.others]
    of_words = "% of words spoken"
    plots = [
        _bars(runs, out / "detected-in-order.png", "detected in order", of_words, 100, spoken, hits_percent),
        _bars(runs, out / "wrong-or-extra.png", "wrong or extra", of_words, None, spoken, wrong_percent),
        _bars(
            runs, out / "false-per-hour.png", "false detections", "per hour", None, unspoken, false_per_hour
        ),
    ]
    if others:
        of_others = "% of the other words said"
        plots.append(
            _bars(
                runs, out / "other-words.png", "other words detected", of_others, None, others, others_percent
            )
        )
    return plots


def others_percent(r: ConditionScore) -> float:
    """Other words detected (all falsely), % of those said."""
    return 100 * r.alignment.insertions / r.others


def hits_percent(r: ConditionScore) -> float:
    """Words detected in order, % of the words spoken."""
    return 100 * r.alignment.hits / r.words


def wrong_percent(r: ConditionScore) -> float:
    """Wrong or extra detections, % of the words spoken."""
    return 100 * r.alignment.wrong_or_extra / r.words


def false_per_hour(r: ConditionScore) -> float:
    """Detections per hour: all false in a stream without words."""
    return 60 * r.alignment.insertions / r.minutes


def _bars(
    runs: dict[str, list[ConditionScore]],
    path: Path,
    title: str,
    ylabel: str,
    top: float | None,
    names: list[str],
    value: Callable[[ConditionScore], float],
) -> Path:
    """A bar chart of value for the conditions named (y from 0 to top), a bar per model, saved at path."""
    from fedspeech_bench.report.plots import pyplot

    plt = pyplot()
    x, width = np.arange(len(names)), 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(names)), 4))
    for i, (model, results) in enumerate(runs.items()):
        values = [value(r) for r in results if r.condition in names]
        ax.bar(x + (i - (len(runs) - 1) / 2) * width, values, width, label=model)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylim(0, top)
    ax.set(ylabel=ylabel, title=f"bench listen: {title}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def result_json(result: ConditionScore) -> dict[str, Any]:
    """A result as JSON, with its detections."""
    return {
        "condition": result.condition,
        "words": result.words,
        "minutes": result.minutes,
        **asdict(result.alignment),
        "false_per_hour": result.false_per_hour,
        "others": result.others,
        "seconds": result.seconds,
        "detections": [
            {"label": d.label, "confidence": float(d.confidence), "time_s": float(d.time_s)}
            for d in result.detections
        ],
    }


def spoken_json(stream: Stream) -> list[dict[str, Any]]:
    """The words spoken in a stream, with their start and end in seconds, as JSON."""
    rate = stream.sample_rate
    return [{"label": w.label, "start_s": w.start / rate, "end_s": w.end / rate} for w in stream.words]


def mean_table(runs: Sequence[Sequence[ConditionScore]]) -> str:
    """The mean and spread (SD) of every condition's figure over runs (each a list of the same conditions)."""
    lines = [
        f"### mean ± SD over {len(runs)} runs",
        "",
        "| condition | detected in order | wrong or extra | false detections/hour | other words detected |",
        "|---|---|---|---|---|",
    ]
    for results in zip(*runs, strict=True):
        first = results[0]
        if first.others:
            cells = ["-", "-", "-", _spread(results, others_percent, "%")]
        elif first.words == 0:
            cells = ["-", "-", _spread(results, false_per_hour), "-"]
        else:
            cells = [_spread(results, hits_percent, "%"), _spread(results, wrong_percent, "%"), "-", "-"]
        lines.append(f"| {first.condition} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def _spread(
    results: Sequence[ConditionScore], value: Callable[[ConditionScore], float], unit: str = ""
) -> str:
    """The mean ± SD of a figure over results (SD 0 for one)."""
    values = [value(r) for r in results]
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return f"{np.mean(values):.1f}{unit} ± {sd:.1f}"
