"""The detection threshold of a model, calibrated on held-out clips; numpy only."""

from collections.abc import Sequence

import numpy as np

LOWEST, HIGHEST = 0.3, 0.95  # a threshold outside these says more about the clips than the model


def calibrate_threshold(probabilities: np.ndarray, labels: np.ndarray, words: Sequence[int]) -> float:
    """The lowest threshold taking the most right word decisions less wrong ones on held-out clips.

    probabilities (clips, classes) are the model's on held-out clips of true classes labels (clips,);
    words are the classes that are words. A clip whose winning class is a word is a decision: right if
    that is its class, wrong otherwise (a wrong word heard). Of the thresholds at which the right
    decisions taken, less the wrong ones taken, are most, the lowest is chosen, clamped to [LOWEST,
    HIGHEST]: held-out clips are whole words, centred, and a live stream's windows are less sure of the
    same words, so every bit of slack left above the wrong decisions is a word missed live. With no
    decision it is HIGHEST.
    """
    probabilities, labels = np.asarray(probabilities), np.asarray(labels)
    if probabilities.ndim != 2 or labels.shape != probabilities.shape[:1]:
        raise ValueError(f"probabilities {probabilities.shape} and labels {labels.shape} do not match")
    winner = probabilities.argmax(axis=1)
    decided = np.isin(winner, list(words))
    if not decided.any():
        return HIGHEST
    confidence = probabilities[np.arange(len(labels)), winner][decided]
    right = (winner == labels)[decided]
    # the gain only changes at a decision's probability: just above a wrong one, or at a right one
    candidates = np.unique(np.concatenate([[LOWEST], confidence[right], np.nextafter(confidence[~right], 1)]))
    taken_right = (confidence[right][None, :] >= candidates[:, None]).sum(axis=1)
    taken_wrong = (confidence[~right][None, :] >= candidates[:, None]).sum(axis=1)
    gain = taken_right - taken_wrong
    return float(np.clip(candidates[np.argmax(gain)], LOWEST, HIGHEST))
