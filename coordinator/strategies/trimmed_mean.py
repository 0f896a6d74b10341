"""Coordinate-wise trimmed mean (Yin et al. 2018, "Byzantine-robust distributed learning"): FedAvg's rounds.

Each weight of the new model is the mean of that weight across the updates without its trim * n largest
and smallest values, so a minority of devices sending extreme values is cut off, while the remaining
honest values are still averaged (less noisy than the median). Sample counts do not weigh in: one device
could claim any number.

With norm_bounded, each update's change is first bounded by the round's median update norm (as the
`norm_bounded` strategy does): a boosted update then carries its device's data at an ordinary size
instead of being trimmed away coordinate by coordinate, and what is left of an attack is trimmed.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from fedspeech.coordinator.strategies.aggregate import clip_updates, median_norm, trimmed_mean
from fedspeech.coordinator.strategies.base import Result
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.coordinator.strategies.params import StrategyParams, setting
from fedspeech.protocol.weights import Arrays


class FedTrimmedMean(FedAvg):
    """All devices, fixed epochs, the coordinate-wise trimmed mean of their updates."""

    name = "trimmed_mean"

    @dataclass(frozen=True)
    class Params(StrategyParams):
        """The trimmed mean's settings."""

        # 0.2 of 6 devices drops 1 high and 1 low value of each weight
        trim: float = setting(0.2, 0.0, 0.49, "the fraction of values cut at each end")

    params: Params

    def __init__(
        self, k: int, epochs: int, params: StrategyParams | None = None, *, norm_bounded: bool = False
    ) -> None:
        super().__init__(k, epochs, params)
        self.norm_bounded = norm_bounded
        if norm_bounded:
            self.name = "norm_bounded_trimmed_mean"

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """The trimmed mean of each weight across the (bounded) updates; sample counts do not weigh in."""
        updates = [r.arrays for r in results]
        if self.norm_bounded:
            updates = clip_updates(current, updates, median_norm(current, updates))
        return trimmed_mean(updates, self.params.trim)
