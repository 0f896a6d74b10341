"""Coordinate-wise median (Yin et al. 2018): FedAvg's rounds, robust aggregation.

Each weight of the new model is the median of that weight across the updates, so one device sending
extreme values cannot drag the model further than the honest majority allows.
"""

from collections.abc import Sequence

from fedspeech.coordinator.strategies.aggregate import coordinate_median
from fedspeech.coordinator.strategies.base import Result
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.protocol.weights import Arrays


class FedMedian(FedAvg):
    """All devices, fixed epochs, the coordinate-wise median of their updates."""

    name = "median"

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """The median of each weight across the updates (sample counts do not weigh in)."""
        return coordinate_median([r.arrays for r in results])
