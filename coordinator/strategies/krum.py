"""Krum and Multi-Krum (Blanchard et al. 2017, "Machine Learning with Adversaries: Byzantine Tolerant
Gradient Descent"): FedAvg's rounds, robust aggregation.

Each update is scored by the summed squared distances to its n - f - 2 nearest other updates; an update
far from the crowd, as a poisoned one is, scores high. Krum takes the one update with the lowest score;
Multi-Krum averages the m lowest, which keeps more of the honest devices' data. With n updates it
tolerates f Byzantine ones where n > 2f + 2. Sample counts do not weigh in: one device could claim any.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedspeech.coordinator.strategies.aggregate import weighted_average
from fedspeech.coordinator.strategies.base import Needs, Result
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.coordinator.strategies.params import StrategyParams, setting
from fedspeech.protocol.weights import Arrays


def squared_distances(updates: Sequence[Arrays]) -> np.ndarray:
    """The squared distance between every two updates' float weights (n, n), infinite on the diagonal."""
    names = [name for name, a in updates[0].items() if np.issubdtype(a.dtype, np.floating)]
    flat = np.stack([np.concatenate([u[name].ravel() for name in names]).astype(np.float64) for u in updates])
    squares = np.sum(flat**2, axis=1)
    distances = np.maximum(squares[:, None] + squares[None, :] - 2 * flat @ flat.T, 0.0)
    np.fill_diagonal(distances, np.inf)
    return distances


def scores_of(distances: np.ndarray, f: int) -> np.ndarray:
    """Krum's score of each update from the squared distances between them: the sum over its n - f - 2
    nearest others (at least one).
    """
    nearest = np.sort(distances, axis=1)[:, : max(1, len(distances) - f - 2)]
    return nearest.sum(axis=1)


def krum_scores(updates: Sequence[Arrays], f: int) -> np.ndarray:
    """Each update's summed squared distance to its n - f - 2 nearest others; ValueError if n <= 2f + 2."""
    n = len(updates)
    if n <= 2 * f + 2:
        raise ValueError(f"Krum with f={f} needs more than {2 * f + 2} updates, got {n}")
    return scores_of(squared_distances(updates), f)


def multi_krum(updates: Sequence[Arrays], f: int, m: int) -> tuple[Arrays, list[int]]:
    """The plain average of the m best-scored updates (1: Krum; 0: n - f of them), and their indices."""
    scores = krum_scores(updates, f)
    count = len(updates) - f if m == 0 else min(m, len(updates) - f)
    chosen = sorted(int(i) for i in np.argsort(scores, kind="stable")[:count])
    return weighted_average([updates[i] for i in chosen], [1.0] * count), chosen


class Krum(FedAvg):
    """All devices, fixed epochs, the average of the m updates closest to their neighbours."""

    name = "krum"

    @dataclass(frozen=True)
    class Params(StrategyParams):
        """Krum's settings."""

        f: int = setting(1, 0, 1000, "Byzantine devices tolerated; a round needs more than 2f + 2 results")
        m: int = setting(1, 0, 10_000, "updates averaged: 1 is Krum, more is Multi-Krum, 0 takes n - f")

    params: Params

    def __init__(self, k: int, epochs: int, params: StrategyParams | None = None) -> None:
        super().__init__(k, epochs, params)
        self.needs = Needs(min_devices=2 * self.params.f + 3)

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """The average of the best-scored updates; sample counts do not weigh in."""
        return multi_krum([r.arrays for r in results], self.params.f, self.params.m)[0]
