"""SiloBN (Andreux et al. 2020, "Siloed Federated Learning for Multi-Centric Histopathology Datasets").

FedAvg's rounds and weights, but each device runs the model with the batch-normalisation statistics of
its own clips. Training normalises by each batch's own statistics, which on a device holding one
speaker are that speaker's; the running statistics only matter when the model runs, and averaged over
speakers they belong to none of them. Unlike the paper, devices send their statistics too, so that
the exported global model is FedAvg's and runs on a device without clips of its own.
"""

from collections.abc import Mapping
from types import MappingProxyType

from fedspeech.coordinator.strategies.base import Needs
from fedspeech.coordinator.strategies.fedavg import FedAvg


class SiloBN(FedAvg):
    """All devices, fixed epochs, FedAvg of everything; each device keeps and runs with its own statistics."""

    name = "silobn"
    needs = Needs(batch_norm=True)
    personal: Mapping[str, float] = MappingProxyType({"local_statistics": 1.0})
