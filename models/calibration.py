"""The detection threshold of a model, calibrated on held-out clips from counts that add up; numpy only.

What calibration needs of a set of clips is how sure the model was of each word it heard there, and whether
that word was right: two rows of counts over confidence bins. Counts from several sets (the coordinator's
held-out clips, each device's test clips) add up to those of their union, so the devices calibrate the
global model without any clip leaving them.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedspeech.protocol.bounds import DECISION_BINS

LOWEST, HIGHEST = 0.3, 0.95  # a threshold outside these says more about the clips than the model
BINS = DECISION_BINS  # confidence counted in steps of 1 / BINS; a threshold is one of the steps
RIGHT, WRONG = 0, 1  # the rows of decision counts
SIGNIFICANCE = 2.0  # standard deviations by which a higher threshold must gain to be chosen
UNCALIBRATED = (
    "not calibrated: no held-out clips (--eval-data) and no evaluation on the devices (--eval-every) yet"
)


@dataclass(frozen=True)
class Decisions:
    """Word decisions counted on a set of clips (decision_counts), and that set in words."""

    counts: np.ndarray
    on: str  # e.g. "300 held-out clips"


def decision_counts(probabilities: np.ndarray, labels: np.ndarray, words: Sequence[int]) -> np.ndarray:
    """(2, BINS) counts of the word decisions on clips, by confidence: right ones, then wrong ones.

    probabilities (clips, classes) are the model's on clips of true classes labels (clips,); words are the
    classes that are words. A clip whose winning class is a word is a decision: right if that is its class,
    wrong otherwise (a wrong word heard). Its confidence p is counted in bin floor(p * BINS).
    """
    probabilities, labels = np.asarray(probabilities), np.asarray(labels)
    if probabilities.ndim != 2 or labels.shape != probabilities.shape[:1]:
        raise ValueError(f"probabilities {probabilities.shape} and labels {labels.shape} do not match")
    winner = probabilities.argmax(axis=1)
    decided = np.isin(winner, list(words))
    confidence = probabilities[np.arange(len(labels)), winner][decided]
    bins = np.minimum((confidence * BINS).astype(np.int64), BINS - 1)
    right = (winner == labels)[decided]
    counts = np.zeros((2, BINS), dtype=np.int64)
    np.add.at(counts, (np.where(right, RIGHT, WRONG), bins), 1)
    return counts


def threshold_of(counts: np.ndarray) -> float | None:
    """The lowest threshold that no higher one beats by more than chance would; None with no decision.

    A threshold t = k / BINS takes the decisions counted in bins k and above; its gain is the right
    decisions it takes less the wrong ones. Raising it to a higher t' gains the wrong decisions between
    them less the right ones, which for n decisions that are as often right as wrong is 0 give or take
    sqrt(n). So the threshold starts at LOWEST and is raised only past confidences where the wrong
    decisions outnumber the right ones by more than SIGNIFICANCE standard deviations of that; then it is
    clamped to HIGHEST. Held-out clips are whole words, centred, and a live stream's windows are less sure
    of the same words: every bit of slack left above the wrong decisions is a word missed live, and a
    threshold set by a few decisions of a small test set is mostly slack.
    """
    counts = np.asarray(counts)
    if counts.shape != (2, BINS) or (counts < 0).any():
        raise ValueError(f"decision counts are (2, {BINS}) non-negative counts, not {counts.shape}")
    if not counts.any():
        return None
    taken = np.append(counts[:, ::-1].cumsum(axis=1)[:, ::-1], [[0], [0]], axis=1)  # at k / BINS and above
    gain, decided = taken[RIGHT] - taken[WRONG], taken[RIGHT] + taken[WRONG]
    # better[k, j]: how much more threshold j gains than k (j > k), and by how much more than chance
    better = gain[None, :] - gain[:, None]
    chance = SIGNIFICANCE * np.sqrt(np.abs(decided[:, None] - decided[None, :]))
    above = np.triu(np.ones_like(better, dtype=bool), 1)
    beaten = ((better > chance) & above).any(axis=1)
    lowest = round(LOWEST * BINS)
    first = lowest + int(np.argmin(beaten[lowest:]))  # the last candidate is never beaten
    return min(first / BINS, HIGHEST)


def calibrate_threshold(probabilities: np.ndarray, labels: np.ndarray, words: Sequence[int]) -> float | None:
    """The threshold of decision_counts on one set of clips (None if no clip was heard as a word)."""
    return threshold_of(decision_counts(probabilities, labels, words))


def calibrate(parts: Sequence[Decisions]) -> tuple[float | None, str]:
    """The threshold of the parts' counts added up, and where it came from in words (or why there is none)."""
    if not parts:
        return None, UNCALIBRATED
    counts = np.sum([part.counts for part in parts], axis=0)
    on = " and ".join(part.on for part in parts)
    threshold = threshold_of(counts)
    if threshold is None:
        return None, f"not calibrated: no word was heard on {on}"
    return threshold, f"calibrated on {int(counts.sum())} word decisions on {on}"
