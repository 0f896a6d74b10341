"""FedBN (Li et al. 2021, "FedBN: federated learning on non-IID features via local batch normalization").

FedAvg's rounds, but the batch-normalisation layers never leave the devices: each device keeps its own
across rounds and uploads only the other arrays, which are averaged as FedAvg does. A speaker's voice,
microphone and room shift the features' statistics; local normalisation absorbs that shift.
"""

from collections.abc import Mapping

import numpy as np

from fedspeech.coordinator.strategies.base import RoundPlan, Work
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.protocol.messages import Profile


class FedBN(FedAvg):
    """All devices, fixed epochs, the sample-weighted average of everything but normalisation layers."""

    name = "fedbn"
    local_norm = True

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """FedAvg's plan, each device told to keep its normalisation layers."""
        plan = super().configure_round(round, pool, rng)
        return RoundPlan({d: Work(w.epochs, {"local_norm": 1.0}) for d, w in plan.work.items()}, plan.needed)
