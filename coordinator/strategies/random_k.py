"""Random-K: k devices drawn at random each round, as in FedAvg's client sampling."""

from collections.abc import Mapping

import numpy as np

from fedspeech.coordinator.strategies.base import RoundPlan, Strategy, Work
from fedspeech.coordinator.strategies.selection import select_random
from fedspeech.protocol.messages import Profile


class RandomK(Strategy):
    """k devices uniformly at random (all of them if the pool is smaller), fixed epochs, FedAvg."""

    name = "random_k"

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """k devices drawn without replacement, in id order."""
        k = min(self.k, len(pool))
        return RoundPlan({d: Work(self.epochs) for d in select_random(list(pool), k, rng)}, needed=k)
