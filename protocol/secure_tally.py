"""The counts a device adds to its masked change under secure aggregation, so that the coordinator learns
them only summed over the round's devices: its training clips per label, and its evaluation of the model
it was sent (the confusion matrix, the word decisions by confidence and the summed loss). They ride as
whole numbers after the change's fixed point, each at most TALLY_MAX, so that the sum of a round's
devices never wraps modulo 2^32.
"""

from dataclasses import dataclass

import numpy as np

from fedspeech.protocol.bounds import DECISION_BINS
from fedspeech.protocol.message_checks import MAX_SECURE_DEVICES

TALLY_MAX = 2**32 // MAX_SECURE_DEVICES - 1  # any one count; a round's sum of them stays below 2^32
LOSS_STEP = 1e-3  # the summed loss is counted in thousandths


def tally_length(classes: int) -> int:
    """The whole numbers of one tally: clips per class, the confusion matrix, the decisions, the loss."""
    return classes + classes * classes + 2 * DECISION_BINS + 1


@dataclass(frozen=True)
class Tally:
    """A device's counts, or a round's sum of them."""

    train_counts: np.ndarray  # (classes,) training clips per class
    confusion: np.ndarray  # (classes, classes) test clips of true class i predicted as j
    decisions: np.ndarray  # (2, DECISION_BINS) right, then wrong word decisions by confidence
    loss_sum: float  # the test clips' summed cross-entropy

    def encode(self) -> np.ndarray:
        """The tally as uint32 whole numbers, each bounded to TALLY_MAX."""
        loss = np.rint(np.asarray([max(self.loss_sum, 0.0)]) / LOSS_STEP)
        parts = [self.train_counts.ravel(), self.confusion.ravel(), self.decisions.ravel(), loss]
        whole = np.concatenate([np.asarray(p, dtype=np.float64) for p in parts])
        return np.clip(np.nan_to_num(whole), 0, TALLY_MAX).astype(np.uint32)


def decode_tally(vector: np.ndarray, classes: int) -> Tally:
    """A tally (or a sum of tallies) from its uint32 numbers; ValueError if it has another length."""
    if len(vector) != tally_length(classes):
        raise ValueError(
            f"a tally of {classes} classes has {tally_length(classes)} numbers, not {len(vector)}"
        )
    counts = np.asarray(vector, dtype=np.uint32).astype(np.int64)
    square = classes + classes * classes
    return Tally(
        counts[:classes],
        counts[classes:square].reshape(classes, classes),
        counts[square:-1].reshape(2, DECISION_BINS),
        float(counts[-1]) * LOSS_STEP,
    )
