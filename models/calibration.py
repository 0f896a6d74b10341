"""The detection threshold of a model, calibrated on held-out clips; numpy only."""

from collections.abc import Sequence

import numpy as np

ACCEPTED = 0.98  # the share of correctly classified word clips the threshold still accepts
LOWEST, HIGHEST = 0.3, 0.95  # a threshold outside these says more about the clips than the model


def calibrate_threshold(probabilities: np.ndarray, labels: np.ndarray, words: Sequence[int]) -> float:
    """The largest threshold accepting ACCEPTED of the held-out word clips the model gets right.

    probabilities (clips, classes) are the model's on held-out clips of true classes labels (clips,);
    words are the classes that are words. The threshold is the winning probability of the correctly
    classified word clips that only a share of 1 - ACCEPTED of them fall below, clamped to [LOWEST,
    HIGHEST]; with no such clip, nothing needs accepting and it is HIGHEST.
    """
    probabilities, labels = np.asarray(probabilities), np.asarray(labels)
    if probabilities.ndim != 2 or labels.shape != probabilities.shape[:1]:
        raise ValueError(f"probabilities {probabilities.shape} and labels {labels.shape} do not match")
    right = (probabilities.argmax(axis=1) == labels) & np.isin(labels, list(words))
    winning = np.sort(probabilities[right, labels[right]])
    if not len(winning):
        return HIGHEST
    rejected = int(np.floor((1 - ACCEPTED) * len(winning) + 1e-9))  # how many may fall below it
    return float(np.clip(winning[rejected], LOWEST, HIGHEST))
