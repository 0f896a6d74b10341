"""The round being trained, as the orchestrator and grouped sequential training share it."""

from dataclasses import dataclass, field

from fedspeech.coordinator.rounds.chains import Chain
from fedspeech.coordinator.store import UpdateRecord
from fedspeech.coordinator.strategies import Result
from fedspeech.protocol.messages import Task


@dataclass
class OpenRound:
    """The round being trained: tasks handed out, updates accepted so far, bytes moved."""

    round: int
    started_at: float
    deadline: float
    tasks: dict[str, Task]
    needed: int  # results to aggregate from devices not required
    required: frozenset[str]  # stale devices waited for on top of the needed results
    updates: dict[str, tuple[Result, UpdateRecord]] = field(default_factory=dict)
    bytes_up: int = 0
    bytes_down: int = 0
    chains: list[Chain] = field(default_factory=list)  # grouped sequential training's groups, if any

    def optional_results(self) -> int:
        """Results received from devices that were not required."""
        return sum(d not in self.required for d in self.updates)
