"""Bulyan (El Mhamdi et al. 2018, "The Hidden Vulnerability of Distributed Learning in Byzantium"):
FedAvg's rounds, robust aggregation on Krum's scores.

Krum picks n - 2f of the n updates, one at a time: each pick is the best-scored of the updates left, scored
among them. Then each weight is the mean of the n - 4f picked values nearest to their median. Krum alone
bounds an update's distance to the others, so an attacker can still move one weight far while staying
close in norm; Bulyan's coordinate-wise step bounds every weight too. It tolerates f Byzantine updates
where n >= 4f + 3. Sample counts do not weigh in: one device could claim any.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedspeech.coordinator.strategies.base import Needs, Result
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.coordinator.strategies.krum import scores_of, squared_distances
from fedspeech.coordinator.strategies.params import StrategyParams, setting
from fedspeech.protocol.weights import Arrays


def bulyan_picks(updates: Sequence[Arrays], f: int) -> list[int]:
    """The indices of the n - 2f updates Krum picks one after another; ValueError if n < 4f + 3."""
    n = len(updates)
    if n < 4 * f + 3:
        raise ValueError(f"Bulyan with f={f} needs at least {4 * f + 3} updates, got {n}")
    distances = squared_distances(updates)
    left, picked = list(range(n)), list[int]()
    while len(picked) < n - 2 * f:
        scores = scores_of(distances[np.ix_(left, left)], f)
        picked.append(left.pop(int(np.argmin(scores))))
    return sorted(picked)


def bulyan(updates: Sequence[Arrays], f: int) -> Arrays:
    """Each weight's mean over the n - 4f values nearest its median among Krum's n - 2f picks."""
    picks = [updates[i] for i in bulyan_picks(updates, f)]
    keep = len(picks) - 2 * f
    aggregated = {}
    for name, first in picks[0].items():
        values = np.stack([u[name].astype(np.float64) for u in picks])
        nearest = np.argsort(np.abs(values - np.median(values, axis=0)), axis=0, kind="stable")[:keep]
        aggregated[name] = np.take_along_axis(values, nearest, axis=0).mean(axis=0).astype(first.dtype)
    return aggregated


class Bulyan(FedAvg):
    """All devices, fixed epochs, Krum's picks averaged weight by weight around their median."""

    name = "bulyan"

    @dataclass(frozen=True)
    class Params(StrategyParams):
        """Bulyan's settings."""

        f: int = setting(1, 0, 1000, "Byzantine devices tolerated; a round needs at least 4f + 3 results")

    params: Params

    def __init__(self, k: int, epochs: int, params: StrategyParams | None = None) -> None:
        super().__init__(k, epochs, params)
        self.needs = Needs(min_devices=4 * self.params.f + 3)

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """Bulyan of the updates; sample counts do not weigh in."""
        return bulyan([r.arrays for r in results], self.params.f)
