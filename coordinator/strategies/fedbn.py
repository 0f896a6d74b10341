"""FedBN (Li et al. 2021, "FedBN: federated learning on non-IID features via local batch normalization").

FedAvg's rounds, but the batch-normalisation layers never leave the devices: each device keeps its own
across rounds and uploads only the other arrays, which are averaged as FedAvg does. A speaker's voice,
microphone and room shift the features' statistics; local normalisation absorbs that shift.
"""

from collections.abc import Mapping
from types import MappingProxyType

from fedspeech.coordinator.strategies.base import Needs
from fedspeech.coordinator.strategies.fedavg import FedAvg


class FedBN(FedAvg):
    """All devices, fixed epochs, the sample-weighted average of everything but normalisation layers."""

    name = "fedbn"
    needs = Needs(batch_norm=True)
    personal: Mapping[str, float] = MappingProxyType({"local_norm": 1.0})
