"""Scores from a confusion matrix, so that counts summed over devices give the same figures as one set."""

import numpy as np


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_classes, num_classes) counts: row is the true class, column the predicted one."""
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(confusion, (np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)), 1)
    return confusion


def accuracy(confusion: np.ndarray) -> float:
    """Correct over all; ValueError for an empty matrix, which has no accuracy."""
    total = confusion.sum()
    if total == 0:
        raise ValueError("no clips counted")
    return float(np.trace(confusion) / total)


def macro_f1(confusion: np.ndarray) -> float:
    """Mean F1 over the classes that occur as a true or a predicted class."""
    true_pos = np.diag(confusion).astype(float)
    denominator = confusion.sum(axis=0) + confusion.sum(axis=1)  # 2TP + FP + FN
    present = denominator > 0
    return float(np.mean(2 * true_pos[present] / denominator[present])) if present.any() else 0.0
