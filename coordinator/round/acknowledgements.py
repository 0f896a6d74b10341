"""Which devices took their tasks: presence on the broker is a hint, an acknowledgement is proof.

On an open broker anyone can publish a device's `online` status. A device acknowledges each task it takes
over HTTP, with its token; one that has not within the acknowledgement timeout of its task is absent for
that task, so a round waits a short timeout for a device that is not there, never its whole deadline. A
device that reports it could not do its task is absent for it at once, and its reason is kept as its last
error for the operator.
"""

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from fedspeech.coordinator.config import DEFAULT_ACK_TIMEOUT_S
from fedspeech.coordinator.refusals import NotWanted
from fedspeech.protocol import log_lines, message_checks
from fedspeech.protocol.messages import Task

MAX_ERRORS = 10_000  # devices whose last error is kept; the oldest is forgotten first


@dataclass
class _Expected:
    device_id: str
    round: int
    due: float  # the time by which the device should have acknowledged
    deadline: float  # the task's: past it, the task is forgotten
    taken: bool = False
    failed: bool = False  # the device reported it could not do it


@dataclass(frozen=True)
class DeviceError:
    """The last task a device could not do: its round, when it said so, and why (escaped, bounded)."""

    round: int
    task_id: str
    reason: str
    at: float  # Unix time


class Acknowledgements:
    """The tasks handed out, whether their devices took them or failed them, and each device's last error;
    thread-safe.
    """

    def __init__(self, timeout_s: float = DEFAULT_ACK_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._tasks: dict[str, _Expected] = {}  # task id -> its device and its acknowledgement
        self._errors: dict[str, DeviceError] = {}  # device -> its last error, the oldest first

    def expect(self, tasks: Iterable[tuple[str, Task]]) -> None:
        """Expect each (device, task) to be acknowledged within the timeout from now (a device acknowledges
        a task as it arrives, busy or not). Tasks past their deadline are forgotten.
        """
        now = time.time()
        due = now + self.timeout_s
        with self._lock:
            self._tasks = {t: e for t, e in self._tasks.items() if e.deadline >= now}
            for device, task in tasks:
                self._tasks[task.task_id] = _Expected(device, task.round, due, task.deadline)

    def forget(self, task_ids: Iterable[str]) -> None:
        """Forget tasks that are over: an acknowledgement of one is not wanted."""
        with self._lock:
            for task_id in task_ids:
                self._tasks.pop(task_id, None)

    def acknowledge(self, device_id: str, task_id: str) -> None:
        """The device took its task; NotWanted if the device was handed no such task, or it is over."""
        with self._lock:
            self._open_task(device_id, task_id).taken = True

    def fail(self, device_id: str, task_id: str, reason: str) -> DeviceError:
        """The device could not do its task: absent for it from now on, the reason (escaped, cut to
        message_checks.MAX_FAILURE_CHARS) its last error. NotWanted, and nothing changed, as acknowledge.
        """
        with self._lock:
            expected = self._open_task(device_id, task_id)
            expected.failed = True
            short = log_lines.escape(reason)[: message_checks.MAX_FAILURE_CHARS]
            error = DeviceError(expected.round, task_id, short, time.time())
            self._errors.pop(device_id, None)
            self._errors[device_id] = error
            while len(self._errors) > MAX_ERRORS:
                del self._errors[next(iter(self._errors))]
            return error

    def last_errors(self) -> dict[str, DeviceError]:
        """Each device's last error: the last task it reported it could not do."""
        with self._lock:
            return dict(self._errors)

    def failed(self, task_id: str) -> bool:
        """Whether the task's device reported it could not do it."""
        with self._lock:
            expected = self._tasks.get(task_id)
            return expected is not None and expected.failed

    def taken(self, task_id: str) -> bool:
        """Whether the task's device has acknowledged it."""
        with self._lock:
            expected = self._tasks.get(task_id)
            return expected is not None and expected.taken

    def absent(self, task_id: str, now: float) -> bool:
        """Whether the task's device is not there for it: it failed it, or it has not acknowledged it and
        the time to do so has passed.
        """
        with self._lock:
            expected = self._tasks.get(task_id)
            return expected is not None and (expected.failed or (not expected.taken and now > expected.due))

    def _open_task(self, device_id: str, task_id: str) -> _Expected:
        """The device's open task of that id; NotWanted if it has none. Under the lock."""
        expected = self._tasks.get(task_id)
        if expected is None or expected.device_id != device_id:
            raise NotWanted(f"{device_id} has no open task {task_id[:64]!r}")
        return expected
