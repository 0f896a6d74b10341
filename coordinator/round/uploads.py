"""Where devices' uploads come in: the open round, the late updates and the global model behind one lock.

Request threads call only this: an update is checked against the task it answers and kept for the round
it counts in, an acknowledgement or a failure noted. The round loop opens and closes rounds here and waits
here for what comes in; nothing else holds the lock. A round waits for a device that is online and took its
task; one that did not acknowledge it in time, or reported it could not do it, is absent, whatever status
the broker shows for it.
"""

import logging
import threading
import time
from collections.abc import Collection
from pathlib import Path

from fedspeech.coordinator.refusals import BadUpload, NotWanted
from fedspeech.coordinator.round.acknowledgements import Acknowledgements, DeviceError
from fedspeech.coordinator.round.evaluation_phase import EvaluationPhase
from fedspeech.coordinator.round.influence import SampleLimits, fleet_median, sample_ceiling
from fedspeech.coordinator.round.interfaces import DeviceLink
from fedspeech.coordinator.round.late_updates import LateUpdates
from fedspeech.coordinator.round.open_round import OpenRound
from fedspeech.coordinator.round.update_check import (
    Upload,
    answered_task,
    check_update,
    expected_task,
    refuse_when_full,
)
from fedspeech.coordinator.state.store import Store
from fedspeech.coordinator.strategies import Result
from fedspeech.protocol import routes, weights
from fedspeech.protocol.bounds import MAX_BLOB_BYTES, MAX_WEIGHTS_HEADER_BYTES
from fedspeech.protocol.messages import ModelSpec, Task
from fedspeech.protocol.weights import Arrays, WeightsError

log = logging.getLogger(__name__)

POLL_S = 0.25  # the longest a wait for uploads lasts before the loop looks again (a stop, a deadline)


class Uploads:
    """The round being trained, the updates that came in for it and the global model they are checked on."""

    def __init__(
        self,
        store: Store,
        link: DeviceLink,
        evaluation: EvaluationPhase,
        *,
        spec: ModelSpec,
        local_names: frozenset[str],
        limits: SampleLimits,
        acks: Acknowledgements | None = None,
    ) -> None:
        """spec: the model's before there is a global one; local_names: the arrays devices keep to
        themselves; limits: what bounds the samples an update counts for; acks: the tasks devices took
        (shared with the evaluation phase).
        """
        self.store, self.link, self.evaluation = store, link, evaluation
        self.acks = acks or Acknowledgements()
        self._local_names, self._limits = local_names, limits
        self._num_classes = spec.num_classes
        self._lock = threading.Condition()
        self._open: OpenRound | None = None
        self._late = LateUpdates()  # a buffered round's tasks past their round, and their updates
        self._global: Arrays | None = None
        self._spec = spec

    # -- called from HTTP handlers -------------------------------------------------------------

    def current_spec(self) -> ModelSpec:
        """The spec of the model devices train now: the global model's, or round 1's before there is one."""
        with self._lock:
            return self._spec

    def open_round(self) -> int | None:
        """The number of the round being trained, if any."""
        with self._lock:
            return self._open.round if self._open else None

    def count_download(self, model_round: int, nbytes: int) -> None:
        """Count a global-model download against the open round it serves."""
        with self._lock:
            if self._open is not None and model_round == self._open.round - 1:
                self._open.bytes_down += nbytes

    def relay_file(self, round: int, step: int, device_id: str) -> Path:
        """The relayed update a device's open task trains from, its download counted; NotWanted for anyone
        else.
        """
        path = routes.relay(round, step)
        with self._lock:
            open_ = self._open
            task = open_.tasks.get(device_id) if open_ is not None and open_.round == round else None
            if open_ is None or task is None or task.weights.path != path:
                raise NotWanted(f"{device_id} has no open task that trains from {path}")
            open_.bytes_down += task.weights.size
        return self.store.relay_path(round, step)

    def upload_limit(self, round: int, device_id: str) -> int:
        """The most bytes a device's update for a round may have, known before its body is read: its task's
        model and a header. NotWanted if it has no task that takes one.
        """
        with self._lock:
            task = expected_task(self._open, self._late, round, device_id)
        # the update carries the arrays it downloaded (or fewer), in the same precision, and its own header
        return min(task.weights.size + MAX_WEIGHTS_HEADER_BYTES, MAX_BLOB_BYTES)

    def receive_update(self, round: int, device_id: str, body: bytes, digest: str) -> None:
        """Check a device's upload and keep it for aggregation; BadUpload or NotWanted say why not.

        Only an accepted update counts as the round's upload traffic.
        """
        try:
            weights.check_digest(body, digest)
            arrays, meta = weights.decode(body)
        except WeightsError as exc:
            raise BadUpload(str(exc)) from None
        upload = Upload(device_id, arrays, meta, digest)
        with self._lock:
            open_, global_ = self._open, self._global
            task = answered_task(open_, self._late, round, upload)
        if global_ is None:
            raise NotWanted("the coordinator has no global model yet")
        if self.acks.failed(task.task_id):  # the round stopped waiting for it on its word
            raise NotWanted(f"{device_id} reported it could not do task {task.task_id}")
        most = self.sample_ceiling(device_id)
        reference = self.shared(global_)
        result, record, claimed = check_update(
            upload, task, reference=reference, most_samples=most, num_classes=self._num_classes
        )
        if record.num_samples < claimed:
            log.warning(
                "round %d: %s claims %d samples; counted as %d (what it registered, grown by at most "
                "%g from its last count, and at most %g x the fleet's median or %d)",
                round, device_id, claimed, record.num_samples, self._limits.growth, self._limits.over_median,
                self._limits.most,
            )  # fmt: skip
        with self._lock:
            if self._late.carried.get(device_id) is task:  # late: it counts in the open round or the next
                self._late.accept(task, result, record, len(body))
                if self._open is not None:
                    self._late.count_in(self._open)
            elif self._open is not open_ or open_ is None or device_id in open_.updates:
                raise NotWanted(f"round {round} closed while the update was checked")
            else:
                refuse_when_full(open_, device_id)  # others' updates may have filled it meanwhile
                open_.took(device_id, result, record, len(body), time.time())
            self._lock.notify_all()
        log.info("round %d: update from %s accepted (%d samples)", round, device_id, record.num_samples)

    def sample_ceiling(self, device_id: str) -> int:
        """The most samples a device's update counts for now: from its registration and its past updates,
        never from its MQTT status, which anyone on the broker can publish.
        """
        registered = {d.device_id: d.num_samples for d in self.store.devices() if d.registered}
        counted = self.store.last_counted()
        median = fleet_median(registered, counted)
        return sample_ceiling(registered.get(device_id, 0), counted.get(device_id), median, self._limits)

    def acknowledge(self, device_id: str, task_id: str) -> None:
        """A device took its task, of the open round, an earlier one or an evaluation; NotWanted if it has
        no such task.
        """
        self.acks.acknowledge(device_id, task_id)
        log.info("%s took its task %s", device_id, task_id)

    def fail(self, device_id: str, task_id: str, reason: str) -> None:
        """A device could not do its task, of the open round, an earlier one or an evaluation: whatever
        waits for it stops waiting, and the reason is its last error. NotWanted if it has no such task.
        """
        error = self.acks.fail(device_id, task_id, reason)
        log.warning(
            "%s could not do its task %s of round %d: %s", device_id, task_id, error.round, error.reason
        )
        with self._lock:
            self._lock.notify_all()  # the round loop looks again now
        self.evaluation.wake()

    def last_errors(self) -> dict[str, DeviceError]:
        """Each device's last error: the last task it said it could not do, since the coordinator started."""
        return self.acks.last_errors()

    def receive_evaluation(self, round: int, device_id: str, body: bytes) -> None:
        """Check a device's evaluation report and keep it; BadUpload or NotWanted say why not."""
        self.evaluation.receive(round, device_id, body)

    # -- called from the round loop -------------------------------------------------------------

    @property
    def current(self) -> Arrays:
        """The global weights devices train now."""
        with self._lock:
            if self._global is None:
                raise RuntimeError("no global model yet")
            return self._global

    def publish(self, arrays: Arrays, spec: ModelSpec) -> None:
        """Take a new global model, of that spec: updates are checked against it from now on."""
        with self._lock:
            self._global, self._spec = arrays, spec

    def shared(self, arrays: Arrays) -> Arrays:
        """The arrays devices send: all but the normalisation layers a method keeps on the devices."""
        return {name: a for name, a in arrays.items() if name not in self._local_names}

    def open(self, round: OpenRound) -> None:
        """Take uploads for a round's tasks from now on; the late updates waiting count in it."""
        with self._lock:
            self._open = round
            self._late.count_in(round)
            self.acks.expect(round.tasks.items())

    def add_task(self, device: str, task: Task) -> None:
        """Take a device's upload for a task handed out while the round is open; its deadline may extend
        the round's.
        """
        with self._lock:
            open_ = self._opened()
            open_.tasks[device] = task
            open_.deadline = max(open_.deadline, task.deadline)
            self.acks.expect([(device, task)])

    def wait_until_complete(self, stop: threading.Event) -> None:
        """Wait until the open round is complete (see complete), its deadline passes or stop is set."""
        with self._lock:
            open_ = self._opened()
            while not stop.is_set() and time.time() < open_.deadline and not self._complete(open_):
                self._lock.wait(timeout=POLL_S)

    def poll(self, devices: Collection[str]) -> tuple[dict[str, Result], list[str]]:
        """After an upload or a moment, the results of those devices that sent one, and those that are late.

        A device is late once its task's deadline has passed or it is absent (_absent): its update is refused
        from then on.
        """
        with self._lock:
            self._lock.wait(timeout=POLL_S)
            open_ = self._opened()
            online, now = set(self.link.online()), time.time()
            answered = {d: open_.updates[d][0] for d in devices if d in open_.updates}
            late = [
                d
                for d in devices
                if d not in answered
                and (now > open_.tasks[d].deadline or self._absent(d, open_.tasks[d], online, now))
            ]
            open_.skipped.update(late)
        return answered, late

    def close(self) -> tuple[OpenRound, list[str]]:
        """Close the open round: no upload counts in it from now on. A buffered round's unanswered tasks
        go on, their updates to count in a later round, but for those never taken in time.

        The round, and its devices whose tasks are over: answered, or not and not carried on.
        """
        with self._lock:
            open_, self._open = self._opened(), None
            now = time.time()
            unanswered = {d: t for d, t in open_.tasks.items() if d not in open_.updates}
            absent = {d for d, t in unanswered.items() if self.acks.absent(t.task_id, now)}
            # not taken by the close, or failed: not there for it, so no straggler either
            open_.never_taken = absent | {d for d, t in unanswered.items() if not self.acks.taken(t.task_id)}
            if open_.buffered:
                self._late.carry(open_, absent)
            over = (open_.tasks.keys() | open_.updates.keys()) - self._late.carried.keys()
            self.acks.forget(open_.tasks[d].task_id for d in over if d in open_.tasks)
        return open_, sorted(over)

    def complete(self, round: OpenRound) -> bool:
        """Whether the round has its needed results and its required devices, or all devices still online."""
        with self._lock:
            return self._complete(round)

    def drop_late(self, ready: Collection[str], spec: ModelSpec) -> tuple[list[str], set[str]]:
        """Forget the carried tasks no longer wanted (LateUpdates.drop); those, and the devices still busy
        with an earlier round's task.
        """
        with self._lock:
            now = time.time()
            carried = self._late.carried
            ready = [d for d in ready if d not in carried or not self.acks.absent(carried[d].task_id, now)]
            task_ids = {d: task.task_id for d, task in carried.items()}
            dropped = self._late.drop(ready, spec, now)
            self.acks.forget(task_ids[d] for d in dropped)
            return dropped, self._late.busy()

    def carried(self) -> dict[str, float]:
        """The devices still training for an earlier round, each with its task's deadline."""
        with self._lock:
            return {device: task.deadline for device, task in self._late.carried.items()}

    def _opened(self) -> OpenRound:
        if self._open is None:
            raise RuntimeError("no round is open")
        return self._open

    def _complete(self, open_: OpenRound) -> bool:
        online, now = set(self.link.online()), time.time()
        # a buffered method's devices still training for earlier rounds may answer in this one too
        tasks = {**self._late.carried, **open_.tasks}
        answered = [d in open_.updates or self._absent(d, t, online, now) for d, t in tasks.items()]
        required_in = all(
            d in open_.updates or self._absent(d, tasks.get(d), online, now) for d in open_.required
        )
        enough = open_.optional_results() >= open_.needed or open_.grace_over(now)
        return all(answered) or (required_in and enough)

    def _absent(self, device: str, task: Task | None, online: set[str], now: float) -> bool:
        """Whether a device is not there for its task: offline, it did not acknowledge the task in time, or
        it said it could not do it.
        """
        return device not in online or (task is not None and self.acks.absent(task.task_id, now))
