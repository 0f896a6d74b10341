"""A buffered method's tasks that outlive their round, and the late updates that answer them."""

import logging
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from fedspeech.coordinator.round.open_round import OpenRound
from fedspeech.coordinator.state.records import UpdateRecord
from fedspeech.coordinator.strategies import Result
from fedspeech.protocol.messages import ModelSpec, Task

log = logging.getLogger(__name__)


@dataclass
class LateUpdates:
    """Devices still training for an earlier round, and their updates waiting for a round to count in.

    Not thread-safe: Uploads calls it under its lock.
    """

    carried: dict[str, Task] = field(default_factory=dict)  # device -> its task of an earlier round
    waiting: dict[str, tuple[Task, Result, UpdateRecord, int]] = field(default_factory=dict)  # and bytes

    def busy(self) -> set[str]:
        """The devices that must not be given new work: training, or their update not yet counted."""
        return self.carried.keys() | self.waiting.keys()

    def task(self, device_id: str, round: int, task_id: str | None) -> Task | None:
        """The carried task an upload for round answers, if any."""
        task = self.carried.get(device_id)
        return task if task is not None and task.round == round and task.task_id == task_id else None

    def carry(self, closed: OpenRound, leave: Collection[str] = ()) -> None:
        """Keep the tasks of a round that just closed that were not answered, but for those of leave."""
        self.carried |= {d: t for d, t in closed.tasks.items() if d not in closed.updates and d not in leave}

    def drop(self, ready: Collection[str], spec: ModelSpec, now: float) -> list[str]:
        """Forget the tasks whose device went offline, whose deadline passed or whose model changed shape."""
        dropped = [
            d
            for d, task in self.carried.items()
            if d not in ready or task.deadline < now or task.spec != spec
        ]
        for device in dropped:
            del self.carried[device]
        return dropped

    def accept(self, task: Task, result: Result, record: UpdateRecord, size: int) -> None:
        """A carried task's update came in: it waits for the round it will count in."""
        del self.carried[result.device_id]
        self.waiting[result.device_id] = (task, result, record, size)

    def count_in(self, open_: OpenRound) -> None:
        """Move the waiting updates into the open round, each with the rounds it is late."""
        for device, (task, result, record, size) in self.waiting.items():
            open_.updates[device] = (replace(result, staleness=open_.round - task.round), record)
            open_.bytes_up += size
            log.info("round %d: the update of %s from round %d counts in it", open_.round, device, task.round)
        self.waiting.clear()
