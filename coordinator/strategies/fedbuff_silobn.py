"""FedBuff's buffered rounds with SiloBN's normalisation statistics of each device's own clips.

FedBuff (Nguyen et al. 2022) neither waits for a slow device nor throws its update away; SiloBN
(Andreux et al. 2020) has each device run the averaged weights with the batch-normalisation
statistics of its own clips. The two are independent: one decides when updates count, the other
which statistics a device runs with.
"""

from collections.abc import Mapping
from types import MappingProxyType

from fedspeech.coordinator.strategies.base import Needs
from fedspeech.coordinator.strategies.fedbuff import FedBuff


class FedBuffSiloBN(FedBuff):
    """Every idle device trains, a round closes on k results; each device runs with its own statistics."""

    name = "fedbuff_silobn"
    needs = Needs(batch_norm=True)
    personal: Mapping[str, float] = MappingProxyType({"local_statistics": 1.0})
