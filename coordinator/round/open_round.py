"""The round being trained, as Uploads keeps it for the round loop and the uploads that come in."""

from dataclasses import dataclass, field

from fedspeech.coordinator.state.records import UpdateRecord
from fedspeech.coordinator.strategies import Result
from fedspeech.protocol.messages import Task

GRACE_MIN_S = 2.0  # the least a round's last devices are given once enough have uploaded


def grace_end(started: float, enough_at: float, grace: float) -> float:
    """When the last devices' grace ends: grace times what the first ones took (at least GRACE_MIN_S)
    after enough had answered.
    """
    return enough_at + max(GRACE_MIN_S, grace * (enough_at - started))


@dataclass
class OpenRound:
    """The round being trained: tasks handed out, updates accepted so far, bytes moved."""

    round: int
    started_at: float
    deadline: float
    tasks: dict[str, Task]
    needed: int  # results to take from devices not required
    required: frozenset[str]  # stale devices waited for on top of the needed results
    # FedBuff's: it takes results past the needed count, and its tasks not answered go on after it
    buffered: bool = False
    updates: dict[str, tuple[Result, UpdateRecord]] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)  # devices whose turn passed: their updates are refused
    # devices that had not acknowledged their task when the round closed, or failed it
    never_taken: set[str] = field(default_factory=set)
    bytes_up: int = 0
    bytes_down: int = 0
    # once `enough` devices have uploaded, the others have `grace` times the time that took (at least
    # GRACE_MIN_S) before the round closes without them; grace 0: they have until the deadline
    enough: int = 0
    grace: float = 0.0
    enough_at: float | None = None

    def took(self, device_id: str, result: Result, record: UpdateRecord, size: int, now: float) -> None:
        """Take a device's update; note when the round has enough."""
        self.updates[device_id] = (result, record)
        self.bytes_up += size
        if self.enough_at is None and self.enough and len(self.updates) >= self.enough:
            self.enough_at = now

    def grace_over(self, now: float) -> bool:
        """Whether the last devices' grace has passed since the round had enough updates."""
        if not self.grace or self.enough_at is None:
            return False
        return now >= grace_end(self.started_at, self.enough_at, self.grace)

    def optional_results(self) -> int:
        """Results received from devices that were not required."""
        return sum(d not in self.required for d in self.updates)
