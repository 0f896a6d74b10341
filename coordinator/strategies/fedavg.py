"""FedAvg (McMahan et al. 2017): every device trains the same epochs; updates weighted by samples."""

from collections.abc import Mapping

import numpy as np

from fedspeech.coordinator.strategies.base import RoundPlan, Strategy, Work
from fedspeech.coordinator.strategies.selection import select_all
from fedspeech.protocol.messages import Profile


class FedAvg(Strategy):
    """All devices, fixed epochs, the sample-weighted average."""

    name = "fedavg"

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """Every device in the pool, in id order, told the strategy's personal settings if it has any."""
        devices = select_all(list(pool))
        return RoundPlan({d: Work(self.epochs, dict(self.personal)) for d in devices}, needed=len(devices))
