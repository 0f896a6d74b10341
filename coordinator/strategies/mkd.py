"""Mutual knowledge distillation, after "Cuing Without Sharing" (FedCSR, ACM MM 2023), for one modality.

Global to server: after each round the coordinator trains a server model on its own data with the new
global model as the teacher (soft labels at temperature T). Server to devices: each device adds a
distillation term towards the server model's soft labels on its own clips. The server model travels as a
second blob only under this strategy; the exported model is the global one.
"""

from collections.abc import Mapping

import numpy as np

from fedspeech.coordinator.strategies.base import RoundPlan, Work
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.protocol.messages import Profile


class MutualDistillation(FedAvg):
    """FedAvg's rounds and average; devices distil the server model, which distils the global one."""

    name = "mkd"
    distils = True

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """FedAvg's plan with the distillation weight and temperature in every device's settings."""
        plan = super().configure_round(round, pool, rng)
        config = {
            "distill_weight": self.settings.distill_weight,
            "distill_temperature": self.settings.distill_temperature,
        }
        return RoundPlan({d: Work(w.epochs, config) for d, w in plan.work.items()}, plan.needed)
