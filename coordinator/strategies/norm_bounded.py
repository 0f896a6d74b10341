"""Norm bounding: FedAvg's rounds, each update's change bounded before the sample-weighted average.

A device can scale its change to the model up (model replacement, "boosting") so that it dominates the
average. Sun et al. 2019, "Can you really backdoor federated learning?", show that bounding the L2 norm
of each update's difference from the global model mitigates this at little cost to accuracy. The bound
here is the median of the round's update norms: it follows the honest majority's scale as training
converges, so no threshold has to be tuned per model; honest updates above the median are shortened
only a little, a boosted one down to an ordinary one. A sign-flipped update of ordinary size passes.
Sample counts do weigh in; the coordinator caps them, as one device could claim any number.
"""

from collections.abc import Sequence

from fedspeech.coordinator.strategies.aggregate import clip_updates, fedavg, median_norm
from fedspeech.coordinator.strategies.base import Result
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.protocol.weights import Arrays


class NormBounded(FedAvg):
    """All devices, fixed epochs, updates bounded to the median update norm, then sample-weighted."""

    name = "norm_bounded"

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """FedAvg of the updates, each change from current bounded to the median of the round's norms."""
        updates = [r.arrays for r in results]
        bounded = clip_updates(current, updates, median_norm(current, updates))
        return fedavg(bounded, [r.num_samples for r in results])
