"""The round being trained, as Uploads keeps it for the round loop and the uploads that come in."""

from dataclasses import dataclass, field

from fedspeech.coordinator.state.records import UpdateRecord
from fedspeech.coordinator.strategies import Result
from fedspeech.protocol.messages import Task


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
    never_taken: set[str] = field(default_factory=set)  # devices that had not acknowledged their task in time
    bytes_up: int = 0
    bytes_down: int = 0

    def optional_results(self) -> int:
        """Results received from devices that were not required."""
        return sum(d not in self.required for d in self.updates)
