"""The class-distribution regulariser of "FedVMR: A New Federated Learning method for Video Moment
Retrieval", adapted to classification.

Each device reports how many of its own clips its trained model predicts as each class (counts, never its
labels). The coordinator pools them into the population distribution p = sum_k n_k / n * q_k and sends p
in the next tasks; devices add lambda * KL(q_k^Y || p) to their loss, q_k^Y the batch's mean prediction,
which pulls a device that lacks some labels away from predicting only its own.
"""

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np

from fedspeech.coordinator.strategies.aggregate import population_distribution
from fedspeech.coordinator.strategies.base import Result, RoundPlan, Work
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.coordinator.strategies.params import StrategyParams, setting
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.weights import Arrays


class ClassPrior(FedAvg):
    """FedAvg's rounds and average; devices regularise their predicted class distribution towards p."""

    name = "class_prior"

    @dataclass(frozen=True)
    class Params(StrategyParams):
        """The class-distribution regulariser's settings."""

        weight: float = setting(1.0, 0.0, 100.0, "the regulariser's lambda")

    params: Params

    def __init__(self, k: int, epochs: int, params: StrategyParams | None = None) -> None:
        super().__init__(k, epochs, params)
        self.prior: list[float] | None = None  # p, once devices have reported
        self._reports: dict[str, tuple[tuple[int, ...], int]] = {}  # this round's counts and samples

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """FedAvg's plan with lambda, and p once known, in every device's settings."""
        plan = super().configure_round(round, pool, rng)
        config: dict[str, float | list[float]] = {"prior_weight": self.params.weight}
        if self.prior is not None:
            config["class_prior"] = self.prior
        self._reports = {}
        return RoundPlan({d: Work(w.epochs, config) for d, w in plan.work.items()}, plan.needed)

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """FedAvg; the predicted class counts are kept for p."""
        for r in results:
            if r.predicted_counts is not None:
                self._reports[r.device_id] = (r.predicted_counts, r.num_samples)
        return super().aggregate(round, results, current)

    def on_round_end(
        self, round: int, plan: RoundPlan, on_time: Set[str], deadline_missed: bool, aggregated: Sequence[str]
    ) -> None:
        """p from the counts of the devices aggregated this round (unchanged if none reported)."""
        reports = [self._reports[d] for d in aggregated if d in self._reports]
        if reports:
            counts, samples = zip(*reports, strict=True)
            self.prior = population_distribution(counts, samples).tolist()
