"""Federated evaluation: the devices' counts on their own test splits, combined into the fleet's scores."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedspeech.coordinator.state.records import DeviceEvaluation
from fedspeech.models import scores as metrics
from fedspeech.models.calibration import RIGHT, WRONG
from fedspeech.protocol.labels import word_classes


@dataclass(frozen=True)
class Counts:
    """One device's report as counts: its confusion matrix (true class by row), summed loss, and word
    decisions by confidence (models.calibration).
    """

    confusion: np.ndarray
    loss_sum: float
    decisions: np.ndarray


@dataclass(frozen=True)
class FederatedEvaluation:
    """Scores over every reported test clip of the fleet, as if the clips were one held-out set."""

    accuracy: float
    macro_f1: float
    loss: float
    clips: int
    devices: list[DeviceEvaluation]
    decisions: np.ndarray  # every report's word decisions, summed: what calibrates the threshold


def check_counts(confusion: np.ndarray, labels: Sequence[str], test_counts: Mapping[str, int]) -> None:
    """ValueError unless each class's clips in a report are at most the test clips its device registered.

    A device could report any counts: a billion correct clips would outvote the whole fleet's figure.
    """
    over = [
        f"{label}: {int(clips)} of {test_counts.get(label, 0)}"
        for label, clips in zip(labels, confusion.sum(axis=1), strict=True)
        if clips > test_counts.get(label, 0)
    ]
    if over:
        shown = ", ".join(over[:3]) + (f" and {len(over) - 3} more" if len(over) > 3 else "")
        raise ValueError(f"more test clips than the device registered ({shown})")


def check_decisions(decisions: np.ndarray, confusion: np.ndarray, labels: Sequence[str]) -> None:
    """ValueError unless a report's word decisions are the ones its confusion matrix holds.

    Each clip predicted as a word is one decision, right on the diagonal, wrong off it: so the decisions
    are bounded by the confusion matrix, which is bounded by the registered test clips. Their shape and
    counts were checked when the report was decoded (message_checks).
    """
    words = word_classes(labels)
    right = int(np.trace(confusion[np.ix_(words, words)]))
    wrong = int(confusion[:, words].sum()) - right
    said = int(decisions[RIGHT].sum()), int(decisions[WRONG].sum())
    if said != (right, wrong):
        raise ValueError(
            f"{said[0]} right and {said[1]} wrong word decisions; the confusion holds {right} and {wrong}"
        )


def device_evaluation(device_id: str, confusion: np.ndarray, loss_sum: float) -> DeviceEvaluation:
    """What the coordinator keeps of one report."""
    return DeviceEvaluation(device_id, int(confusion.sum()), int(np.trace(confusion)), float(loss_sum))


def combine(reports: Mapping[str, Counts], min_reports: int) -> FederatedEvaluation | None:
    """Sum the reports with at least one clip; None when fewer than min_reports devices had any.

    Summing confusion matrices gives exactly the scores of the union of the devices' test clips, and
    summing word decisions exactly the union's.
    """
    counted = {d: report for d, report in reports.items() if report.confusion.sum() > 0}
    if not counted or len(counted) < min_reports:
        return None
    total = Counts(
        np.sum([report.confusion for report in counted.values()], axis=0),
        sum(report.loss_sum for report in counted.values()),
        np.sum([report.decisions for report in counted.values()], axis=0),
    )
    return scored(total, [device_evaluation(d, r.confusion, r.loss_sum) for d, r in sorted(counted.items())])


def scored(total: Counts, devices: list[DeviceEvaluation]) -> FederatedEvaluation:
    """The scores of counts summed over devices (with at least one clip), and those devices' own."""
    confusion = total.confusion
    clips = int(confusion.sum())
    return FederatedEvaluation(
        metrics.accuracy(confusion), metrics.macro_f1(confusion), total.loss_sum / clips, clips, devices,
        total.decisions,
    )  # fmt: skip
