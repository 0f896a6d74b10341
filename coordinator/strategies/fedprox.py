"""FedProx (Li et al. 2020): FedAvg whose devices keep near the global model with a proximal term."""

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedspeech.coordinator.strategies.base import RoundPlan, Work
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.coordinator.strategies.params import StrategyParams, setting
from fedspeech.protocol.messages import Profile


class FedProx(FedAvg):
    """FedAvg's rounds; each device adds mu/2 * ||w - w_global||^2 to its loss."""

    name = "fedprox"

    @dataclass(frozen=True)
    class Params(StrategyParams):
        """FedProx's settings."""

        mu: float = setting(0.01, 0.0, 100.0, "the proximal term's weight")

    params: Params

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """FedAvg's plan, with mu in every device's training settings."""
        plan = super().configure_round(round, pool, rng)
        work = {d: Work(w.epochs, {"proximal_mu": self.params.mu}) for d, w in plan.work.items()}
        return RoundPlan(work, plan.needed)
