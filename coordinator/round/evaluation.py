"""Federated evaluation: the devices' counts on their own test splits, combined into the fleet's scores."""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

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


# A device holds out a fifth of its clips for testing (models.clips.datasets.TEST_FRACTION), a quarter as
# many as it trains on; but one that trains on few of them (`fedspeech client --max-samples`) still tests
# on all it holds out: the tests' devices train on 24 and hold out 50. Ten times its training clips, and
# at least MIN_TEST_CLIPS, covers both; past that a report is refused. Within it, each report weighs at
# most the median report's clips (combine).
TEST_OVER_TRAINING = 10.0
MIN_TEST_CLIPS = 20


def most_test_clips(training: int) -> int:
    """The most test clips a device may report that counts for `training` training clips (its ceiling,
    which grows slowly from its registration): a registration of a billion test clips buys nothing.
    """
    return max(MIN_TEST_CLIPS, math.ceil(TEST_OVER_TRAINING * training))


def check_counts(
    confusion: np.ndarray, labels: Sequence[str], test_counts: Mapping[str, int], training: int
) -> None:
    """ValueError unless each class's clips in a report are at most the test clips its device registered,
    and all of them at most most_test_clips(training).

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
    if (total := int(confusion.sum())) > (most := most_test_clips(training)):
        raise ValueError(
            f"{total} test clips, more than the {most} its {training} training clips make plausible"
        )


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
    """The reports with at least one clip, each weighed to at most the median report's clips, summed; None
    when fewer than min_reports devices had any.

    Summing confusion matrices gives the scores of the union of the devices' test clips, and summing
    word decisions the union's. A device registers its own test clips: one that registers many and
    reports them all correct, at top confidence, would otherwise own the fleet's figure and the threshold
    calibrated on it. Weighed down to the median device's clips, it moves them by at most its share. The
    clips the figure rests on are counted as reported.
    """
    counted = {d: report for d, report in reports.items() if report.confusion.sum() > 0}
    if not counted or len(counted) < min_reports:
        return None
    median = float(np.median([report.confusion.sum() for report in counted.values()]))
    weights = [min(1.0, median / float(report.confusion.sum())) for report in counted.values()]
    total = Counts(
        np.sum([w * report.confusion for w, report in zip(weights, counted.values(), strict=True)], axis=0),
        sum(w * report.loss_sum for w, report in zip(weights, counted.values(), strict=True)),
        np.sum([w * report.decisions for w, report in zip(weights, counted.values(), strict=True)], axis=0),
    )
    devices = [device_evaluation(d, r.confusion, r.loss_sum) for d, r in sorted(counted.items())]
    return replace(scored(total, devices), clips=sum(device.clips for device in devices))


def scored(total: Counts, devices: list[DeviceEvaluation]) -> FederatedEvaluation:
    """The scores of counts summed over devices (with at least one clip), and those devices' own."""
    confusion = total.confusion
    clips = float(confusion.sum())
    return FederatedEvaluation(
        metrics.accuracy(confusion), metrics.macro_f1(confusion), total.loss_sum / clips, round(clips),
        devices, total.decisions,
    )  # fmt: skip


OUTLYING_POINTS = 0.1  # the least distance from the other reports' median accuracy that is flagged


def outlying(accuracies: Mapping[str, float]) -> dict[str, float]:
    """The devices whose reported accuracy lies far from the others': by more than OUTLYING_POINTS and
    three times the others' median absolute deviation; each with the others' median. A report that
    claims every clip right stands out while the model is still learning; one that is honest but far
    off tells of a voice or a microphone the model serves badly, which an operator wants to see too.
    """
    flagged = {}
    for device, accuracy in accuracies.items():
        others = [a for d, a in accuracies.items() if d != device]
        if len(others) < 2:
            continue
        median = float(np.median(others))
        spread = float(np.median([abs(a - median) for a in others]))
        if abs(accuracy - median) > max(OUTLYING_POINTS, 3 * spread):
            flagged[device] = median
    return flagged
