"""Hardware-aware federated learning (the hardware-aware speech emotion recognition paper).

Devices are scored from their measured profiles (S_i, normalised across the pool); the best K are
asked, over-selected so stragglers can be cut, with some exploration; each trains epochs scaled by
S_i / S_max; updates are weighted by n_i * S_i. Each part can be switched off for the ablations.
A device that lets a round run into its deadline is scored down, and one whose update has not been
aggregated for max_staleness rounds is asked and waited for, however slow.
"""

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np

from fedspeech.coordinator.strategies.aggregate import fedavg, hardware_weighted
from fedspeech.coordinator.strategies.base import Result, RoundPlan, SecureTerms, Strategy, Work
from fedspeech.coordinator.strategies.params import StrategyParams, setting
from fedspeech.coordinator.strategies.scheduling import adaptive_epochs, fixed_epochs
from fedspeech.coordinator.strategies.selection import (
    DEFAULT_WEIGHTS,
    ScoreWeights,
    hardware_scores,
    select_all,
    select_top_k,
    update_penalties,
)
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.weights import Arrays


class HardwareAware(Strategy):
    """Top-K by hardware score, epochs scaled by score, aggregation by samples times score."""

    @dataclass(frozen=True)
    class Params(StrategyParams):
        """The hardware-aware method's settings."""

        over_select: float = setting(
            1.3, 1.0, 10.0, "devices asked per result needed, so stragglers can be cut"
        )
        explore: float = setting(0.1, 0.0, 1.0, "chance that a slot goes to a random device")
        max_staleness: int = setting(
            5, 0, 1000, "rounds without an aggregated update before a device is waited for (0: never)"
        )

    params: Params

    def __init__(
        self,
        k: int,
        epochs: int,
        params: StrategyParams | None = None,
        *,
        name: str = "hardware",
        top_k: bool = True,
        adaptive: bool = True,
        weighted: bool = True,
        weights: ScoreWeights = DEFAULT_WEIGHTS,
    ) -> None:
        super().__init__(k, epochs, params)
        self.name, self.top_k, self.adaptive, self.weighted = name, top_k, adaptive, weighted
        self.weights = weights
        self.scores: dict[str, float] = {}  # S_i of the pool the last plan was made from
        self.penalties: dict[str, float] = {}  # deadline misses score a device down
        self.last_aggregated: dict[str, int] = {}  # the round each device's update was last aggregated

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """Score the pool, choose the devices and their epochs."""
        devices = sorted(pool)
        self.scores = hardware_scores(pool, self.weights, self.penalties)
        required: list[str] = []
        if not self.top_k:
            selected = select_all(devices)
            needed = len(selected)
        else:
            k = min(self.k, len(devices))
            selected = select_top_k(
                self.scores, k, over_select=self.params.over_select, explore=self.params.explore, rng=rng
            )
            needed = min(k, len(selected))
            if self.params.max_staleness:
                stale = [
                    d for d in devices if round - self.last_aggregated.get(d, 0) >= self.params.max_staleness
                ]
                required = [d for d in stale if d not in selected[:needed]]
                selected = [d for d in selected if d not in required] + required
                needed = min(needed, len(selected) - len(required))
        if self.adaptive:
            # S_max over the devices of this round: its most capable one trains the full epochs.
            epochs = adaptive_epochs({d: self.scores[d] for d in selected}, self.epochs)
        else:
            epochs = fixed_epochs(selected, self.epochs)
        return RoundPlan({d: Work(epochs[d]) for d in selected}, needed, required)

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """n_i * S_i weighting with the scores the round was planned with, or FedAvg."""
        updates, samples = [r.arrays for r in results], [r.num_samples for r in results]
        if not self.weighted:
            return fedavg(updates, samples)
        return hardware_weighted(updates, samples, [self.scores[r.device_id] for r in results])

    def secure_terms(self) -> SecureTerms | None:
        """Without the n_i * S_i weighting, FedAvg: a secure sum gives it."""
        return SecureTerms() if not self.weighted and self.mode == "parallel" else None

    def on_round_end(
        self, round: int, plan: RoundPlan, on_time: Set[str], deadline_missed: bool, aggregated: Sequence[str]
    ) -> None:
        """Score down the devices that let the round run into its deadline; note whose update counted."""
        # Only a device that let the round run into its deadline is scored down; one merely beaten to the
        # first K results by faster devices is not.
        missed = plan.selected if deadline_missed else on_time
        self.penalties = update_penalties(self.penalties, missed, on_time)
        self.last_aggregated.update(dict.fromkeys(aggregated, round))
