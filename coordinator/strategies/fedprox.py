"""FedProx (Li et al. 2020): FedAvg whose devices keep near the global model with a proximal term."""

from collections.abc import Mapping

import numpy as np

from fedspeech.coordinator.strategies.base import RoundPlan, Work
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.protocol.messages import Profile


class FedProx(FedAvg):
    """FedAvg's rounds; each device adds mu/2 * ||w - w_global||^2 to its loss."""

    name = "fedprox"

    def __init__(self, k: int, epochs: int, mu: float = 0.01) -> None:
        super().__init__(k, epochs)
        if mu < 0:
            raise ValueError("mu must not be negative")
        self.mu = mu

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """FedAvg's plan, with mu in every device's training settings."""
        plan = super().configure_round(round, pool, rng)
        work = {d: Work(w.epochs, {"proximal_mu": self.mu}) for d, w in plan.work.items()}
        return RoundPlan(work, plan.needed)
