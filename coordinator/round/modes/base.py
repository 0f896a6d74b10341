"""What every round mode is given and gives back: one function, train(round, plan, context) -> Collected."""

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fedspeech.coordinator.config import RoundConfig
from fedspeech.coordinator.privacy.secure_sum_uploads import SecureSumUploads
from fedspeech.coordinator.round.interfaces import DeviceLink
from fedspeech.coordinator.round.open_round import OpenRound
from fedspeech.coordinator.round.uploads import Uploads
from fedspeech.coordinator.state.store import Store
from fedspeech.coordinator.strategies import Result, RoundPlan, SecureTerms
from fedspeech.protocol.messages import Task
from fedspeech.protocol.secure_tally import Tally
from fedspeech.protocol.weights import Arrays

# the round's training tasks for these devices, due at that time, on the latest global model
TaskMaker = Callable[[Sequence[str], float], dict[str, Task]]


@dataclass(frozen=True)
class RoundContext:
    """What a round mode works with: when the round started, its uploads, the devices, store, tasks."""

    started: float
    config: RoundConfig
    uploads: Uploads  # where the round is opened and closed, and its uploads come in
    link: DeviceLink
    store: Store
    tasks: TaskMaker
    stop: threading.Event  # set: the mode returns as soon as it can
    secure_uploads: SecureSumUploads = field(
        default_factory=SecureSumUploads
    )  # a secure sum's phases, for its mode
    secure_terms: SecureTerms | None = None  # how a secure sum gives the strategy's model (None: FedAvg)


@dataclass(frozen=True)
class Collected:
    """What a round's training brought in, once its round is closed."""

    closed: OpenRound  # its tasks, the updates accepted and the bytes moved
    results: list[Result]  # to aggregate: each an update laid onto the current model, or a group's model
    missed: bool  # whether a device selected did not answer in time
    # a result's device -> the devices whose updates it carries (by default, its own alone)
    stands_for: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # the round's new model already (a secure sum's): no update was seen alone, none is aggregated again
    combined: Arrays | None = None
    tally: Tally | None = None  # the secure sum's counts: its devices' clips per label and evaluations

    def devices_in(self, results: Sequence[Result]) -> set[str]:
        """The devices whose updates went into these results."""
        return {d for r in results for d in self.stands_for.get(r.device_id, [r.device_id])}


RoundMode = Callable[[int, RoundPlan, RoundContext], Collected]
