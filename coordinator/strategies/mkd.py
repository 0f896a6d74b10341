"""Mutual knowledge distillation, after "Cuing Without Sharing" (FedCSR, ACM MM 2023), for one modality.

Global to server: after each round the coordinator trains a server model on its own data with the new
global model as the teacher (soft labels at temperature T). Server to devices: each device adds a
distillation term towards the server model's soft labels on its own clips. The server model travels as a
second blob only under this strategy; the exported model is the global one.
"""

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedspeech.coordinator.strategies.base import Needs, RoundPlan, ServerSide, Work
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.coordinator.strategies.params import StrategyParams, setting
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.weights import Arrays


class MutualDistillation(FedAvg):
    """FedAvg's rounds and average; devices distil the server model, which distils the global one."""

    name = "mkd"
    needs = Needs(server_data=True)

    @dataclass(frozen=True)
    class Params(StrategyParams):
        """Mutual distillation's settings."""

        weight: float = setting(1.0, 0.0, 100.0, "the devices' distillation term's weight")
        temperature: float = setting(2.0, 0.05, 100.0, "the soft labels' temperature")

    params: Params

    def __init__(self, k: int, epochs: int, params: StrategyParams | None = None) -> None:
        super().__init__(k, epochs, params)
        self.server: Arrays | None = None  # the server model, once trained

    def after_aggregate(self, round: int, new: Arrays, server: ServerSide) -> Arrays | None:
        """The server model trained on the server's clips towards the new global model: the next teacher."""
        student = self.server if self.server is not None and self.server.keys() == new.keys() else new
        self.server = server.distil(student, new, self.params.temperature, round)
        return self.server

    def restore(self, teacher: Arrays) -> None:
        """The server model, as stored with the last round."""
        self.server = teacher

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """FedAvg's plan with the distillation weight and temperature in every device's settings."""
        plan = super().configure_round(round, pool, rng)
        config = {
            "distill_weight": self.params.weight,
            "distill_temperature": self.params.temperature,
        }
        return RoundPlan({d: Work(w.epochs, config) for d, w in plan.work.items()}, plan.needed)
