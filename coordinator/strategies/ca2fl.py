"""CA2FL (Wang et al. 2024): FedBuff's rounds, each step calibrated with every device's last change.

Rounds run as FedBuff's do: every idle device trains and a round closes on its first k results. The
coordinator keeps each device's last counted change. A round's step is the mean of those changes plus
the mean difference between each new update's change and its device's cached one, so a slow device's
speaker moves the model every round, not only in the rounds its update arrives in.

The cache costs the coordinator one model-sized float32 array set per device, in memory only: a
restart starts it again, as it does server momentum, and so does the model growing.
"""

from collections.abc import Sequence, Set
from dataclasses import dataclass

from fedspeech.coordinator.strategies.aggregate import cache_calibrated, change, stepped
from fedspeech.coordinator.strategies.base import Result, RoundPlan
from fedspeech.coordinator.strategies.fedbuff import FedBuff
from fedspeech.coordinator.strategies.params import StrategyParams
from fedspeech.protocol.weights import Arrays

# a device silent this long stops moving the model (it may have left the fleet); several times the
# rounds a Pi 3 among Pi 4s and 5s is late in our emulated fleets
CACHE_ROUNDS = 8


@dataclass(frozen=True)
class Cached:
    """A device's last counted change, its samples and the round it counted in."""

    change: Arrays
    num_samples: int
    round: int


class CachedCalibration(FedBuff):
    """FedBuff's rounds; the step is every device's last change, calibrated by the new ones."""

    name = "ca2fl"

    def __init__(self, k: int, epochs: int, params: StrategyParams | None = None) -> None:
        super().__init__(k, epochs, params)
        self.cache: dict[str, Cached] = {}
        self._offered: dict[str, Cached] = {}  # the changes of the open round's results

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """current + the mean cached change + the new changes' mean difference from their cached ones."""
        # a change cached before the model grew no longer fits it
        shapes = {name: a.shape for name, a in current.items() if stepped(name, a)}
        fits = {d: c for d, c in self.cache.items() if {n: a.shape for n, a in c.change.items()} == shapes}
        # may be called again on fewer results when one breaks the aggregation: cached at round end
        self._offered.update(
            {r.device_id: Cached(change(current, r.arrays), r.num_samples, round) for r in results}
        )
        previous = [fits[r.device_id].change if r.device_id in fits else None for r in results]
        return cache_calibrated(
            current,
            [r.arrays for r in results],
            [r.num_samples for r in results],
            previous,
            [(c.change, c.num_samples) for c in fits.values()],
        )

    def on_round_end(
        self, round: int, plan: RoundPlan, on_time: Set[str], deadline_missed: bool, aggregated: Sequence[str]
    ) -> None:
        """Caches the changes that went into the new model and forgets those too old to count."""
        self.cache.update({d: self._offered[d] for d in aggregated})
        self.cache = {d: c for d, c in self.cache.items() if round - c.round < CACHE_ROUNDS}
        self._offered = {}
