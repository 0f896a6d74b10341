"""The buffered round mode, FedBuff's (Nguyen et al. 2022): a round closes on its first K results; the
devices still training go on, and their late updates count in a later round (Uploads keeps them in
coordinator.late_updates), laid onto the model they arrive at.
"""

from fedspeech.coordinator.round.modes import parallel
from fedspeech.coordinator.round.modes.base import Collected, RoundContext
from fedspeech.coordinator.strategies import RoundPlan


def train(round: int, plan: RoundPlan, context: RoundContext) -> Collected:
    """The parallel mode's round, taking every result and carrying the tasks not answered past it."""
    return parallel.hand_out_and_collect(round, plan, context, buffered=True)
