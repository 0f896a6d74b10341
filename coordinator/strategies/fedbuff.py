"""FedBuff (Nguyen et al. 2022): buffered asynchronous aggregation.

Every idle device trains. A round closes on its first k results, late ones included, and a device
still training goes on: its update counts in a later round, its change laid onto the model it arrives
at and weighted down by 1 / sqrt(1 + the rounds it is late). A slow device is neither waited for nor
thrown away, and it downloads a model only when it is ready for one.
"""

from collections.abc import Mapping, Sequence

import numpy as np

from fedspeech.coordinator.strategies.aggregate import staleness_weighted
from fedspeech.coordinator.strategies.base import Result, RoundPlan, Strategy, Work
from fedspeech.coordinator.strategies.selection import select_all
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.weights import Arrays


class FedBuff(Strategy):
    """Every idle device trains; a round closes on k results, the late ones among them discounted."""

    name = "fedbuff"
    mode = "buffered"

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """Every device not still training for an earlier round, told the strategy's personal settings."""
        devices = select_all(list(pool))
        return RoundPlan({d: Work(self.epochs, dict(self.personal)) for d in devices}, needed=self.k)

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """The average weighted by samples / sqrt(1 + staleness)."""
        updates = [r.arrays for r in results]
        return staleness_weighted(updates, [r.num_samples for r in results], [r.staleness for r in results])
