"""Quality-weighted aggregation: the c-validation set of "FedVMR: A New Federated Learning method for
Video Moment Retrieval".

The coordinator scores each local model on a small validation set (accuracy): its own clips, and clips
devices chose to share. It averages the updates with weights softmax(score / temperature), optionally
times each update's samples: a local model that generalises worse counts for less.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from fedspeech.coordinator.strategies.aggregate import quality_weights, weighted_average
from fedspeech.coordinator.strategies.base import Needs, Result, ServerSide
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.coordinator.strategies.params import StrategyParams, flag, setting
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)


class QualityWeighted(FedAvg):
    """All devices, fixed epochs, the average weighted by each update's validation score."""

    name = "quality"
    needs = Needs(validation=True)

    @dataclass(frozen=True)
    class Params(StrategyParams):
        """Quality weighting's settings."""

        temperature: float = setting(0.1, 0.01, 100.0, "weights softmax(score / temperature)")
        by_samples: bool = flag(False, "weights also times each update's samples")

    params: Params

    def before_aggregate(self, round: int, results: list[Result], server: ServerSide) -> list[Result]:
        """Each result with its score on the coordinator's validation set."""
        scored = [replace(r, score=server.score(r.arrays)) for r in results]
        scores = ", ".join(f"{r.device_id} {r.score:.4f}" for r in scored if r.score is not None)
        log.info("round %d: validation scores %s", round, scores)
        return scored

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """The updates averaged with weights softmax(score / T) (times samples if so configured)."""
        scores = [r.score for r in results]
        if any(s is None for s in scores):  # no validation clips yet: devices share theirs as they start
            log.warning("round %d: no validation clips to score the updates on: FedAvg's weights", round)
            return super().aggregate(round, results, current)
        samples = [r.num_samples for r in results] if self.params.by_samples else None
        weights = quality_weights(
            [float(s) for s in scores if s is not None], self.params.temperature, samples
        )
        return weighted_average([r.arrays for r in results], weights)
