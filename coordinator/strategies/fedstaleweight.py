"""FedStaleWeight (Ma et al. 2024): FedBuff's rounds, with slow devices weighted up instead of down.

Rounds run as FedBuff's do: every idle device trains and a round closes on its first k results. But
where FedBuff discounts a late update, this weights each update by 1 + its device's mean staleness
over the updates of it that counted, so that a device counting once every two rounds has the same
say over time as one counting every round.
"""

from collections.abc import Sequence, Set

from fedspeech.coordinator.strategies.aggregate import staleness_fair
from fedspeech.coordinator.strategies.base import Result, RoundPlan
from fedspeech.coordinator.strategies.fedbuff import FedBuff
from fedspeech.coordinator.strategies.params import StrategyParams
from fedspeech.protocol.weights import Arrays


class FedStaleWeight(FedBuff):
    """FedBuff's rounds; each update weighted by its samples * (1 + its device's mean staleness)."""

    name = "fedstaleweight"

    def __init__(self, k: int, epochs: int, params: StrategyParams | None = None) -> None:
        super().__init__(k, epochs, params)
        self.staleness_sum: dict[str, int] = {}  # over each device's updates that counted
        self.counted: dict[str, int] = {}
        self._offered: dict[str, int] = {}  # the staleness of the updates offered in the open round

    def mean_staleness(self, device_id: str, staleness: int) -> float:
        """The device's mean staleness over its counted updates and one more of this staleness."""
        return (self.staleness_sum.get(device_id, 0) + staleness) / (self.counted.get(device_id, 0) + 1)

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """The average weighted by samples * (1 + the device's mean staleness, this update included)."""
        # may be called again on fewer results when one breaks the aggregation: counted at round end
        self._offered.update({r.device_id: r.staleness for r in results})
        means = [self.mean_staleness(r.device_id, r.staleness) for r in results]
        return staleness_fair([r.arrays for r in results], [r.num_samples for r in results], means)

    def on_round_end(
        self, round: int, plan: RoundPlan, on_time: Set[str], deadline_missed: bool, aggregated: Sequence[str]
    ) -> None:
        """Counts the staleness of the updates that went into the new model."""
        for device_id in aggregated:
            self.staleness_sum[device_id] = self.staleness_sum.get(device_id, 0) + self._offered[device_id]
            self.counted[device_id] = self.counted.get(device_id, 0) + 1
        self._offered = {}
