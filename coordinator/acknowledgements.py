"""Which devices took their tasks: presence on the broker is a hint, an acknowledgement is proof.

On an open broker anyone can publish a device's `online` status. A device acknowledges each task it takes
over HTTP, with its token; one that has not within the acknowledgement timeout of its task is absent for
that task, so a round waits a short timeout for a device that is not there, never its whole deadline.
"""

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from fedspeech.coordinator.errors import NotWanted
from fedspeech.protocol.messages import Task

DEFAULT_TIMEOUT_S = 10.0


@dataclass
class _Expected:
    device_id: str
    due: float  # the time by which the device should have acknowledged
    deadline: float  # the task's: past it, the task is forgotten
    taken: bool = False


class Acknowledgements:
    """The tasks handed out and whether their devices took them; thread-safe."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._tasks: dict[str, _Expected] = {}  # task id -> its device and its acknowledgement

    def expect(self, tasks: Iterable[tuple[str, Task]]) -> None:
        """Expect each (device, task) to be acknowledged within the timeout from now (a device acknowledges
        a task as it arrives, busy or not). Tasks past their deadline are forgotten.
        """
        now = time.time()
        due = now + self.timeout_s
        with self._lock:
            self._tasks = {t: e for t, e in self._tasks.items() if e.deadline >= now}
            for device, task in tasks:
                self._tasks[task.task_id] = _Expected(device, due, task.deadline)

    def forget(self, task_ids: Iterable[str]) -> None:
        """Forget tasks that are over: an acknowledgement of one is not wanted."""
        with self._lock:
            for task_id in task_ids:
                self._tasks.pop(task_id, None)

    def acknowledge(self, device_id: str, task_id: str) -> None:
        """The device took its task; NotWanted if the device was handed no such task, or it is over."""
        with self._lock:
            expected = self._tasks.get(task_id)
            if expected is None or expected.device_id != device_id:
                raise NotWanted(f"{device_id} has no open task {task_id[:64]!r}")
            expected.taken = True

    def absent(self, task_id: str, now: float) -> bool:
        """Whether the task's device has not acknowledged it, and the time to do so has passed."""
        with self._lock:
            expected = self._tasks.get(task_id)
            return expected is not None and not expected.taken and now > expected.due
