"""Federated evaluation of a round's model: tasks out to the devices, their counts in, pooled and stored."""

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedspeech.coordinator.config import RoundConfig
from fedspeech.coordinator.refusals import BadUpload, NotWanted
from fedspeech.coordinator.round.acknowledgements import Acknowledgements
from fedspeech.coordinator.round.evaluation import (
    Counts,
    check_counts,
    check_decisions,
    combine,
    most_test_clips,
    scored,
)
from fedspeech.coordinator.round.interfaces import DeviceLink
from fedspeech.coordinator.state.store import StateWriteError, Store
from fedspeech.models.calibration import BINS, Decisions
from fedspeech.protocol import bounds, messages
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import EvaluationReport, Task
from fedspeech.protocol.secure_tally import Tally

log = logging.getLogger(__name__)


def evaluates(round: int, every: int, last_round: int) -> bool:
    """Whether a round's model is evaluated on the devices: every Nth round and the last; never if N is 0."""
    return every > 0 and (round % every == 0 or round == last_round)


def evaluators(candidates: Sequence[str], wanted: int, seed: int, round: int) -> list[str]:
    """The devices asked to evaluate a round: every candidate, or `wanted` of them drawn by seed and round."""
    if not 0 < wanted < len(candidates):
        return list(candidates)
    rng = np.random.default_rng([seed, round, 1])
    return sorted(rng.choice(list(candidates), wanted, replace=False).tolist())


def evaluation_plan(
    config: RoundConfig, round: int, online: Sequence[str], training: Mapping[str, float], now: float
) -> tuple[list[str], float]:
    """The devices asked to evaluate a round's model, and their deadline.

    `training` maps a device still training for an earlier round to its task's deadline. Such a device
    evaluates only the last round's model, once its training is done: waiting for it sooner would hold
    up the rounds a buffered method runs without it.
    """
    last = round == config.rounds
    candidates = [d for d in online if last or d not in training]
    devices = evaluators(candidates, config.eval_devices, config.seed, round)
    trained_by = max([now, *(training[d] for d in devices if d in training)])
    return devices, min(trained_by + config.eval_timeout, now + bounds.MAX_TASK_SECONDS)


@dataclass
class OpenEvaluation:
    """A round's model being evaluated on the devices: the tasks handed out and the reports so far."""

    round: int
    tasks: dict[str, Task]
    reports: dict[str, Counts] = field(default_factory=dict)


class EvaluationPhase:
    """One evaluation at a time: run() waits for the reports that HTTP handlers pass to receive(), from the
    devices online that took their tasks (acks).
    """

    def __init__(
        self,
        store: Store,
        link: DeviceLink,
        labels: Sequence[str],
        min_reports: int,
        acks: Acknowledgements | None = None,
    ) -> None:
        """labels: the task's, in the order of the classes of a report's confusion matrix."""
        self.store, self.link, self.labels, self.min_reports = store, link, list(labels), min_reports
        # the training clips a device counts for now: what it registered, or what the round loop sets
        self.training: Callable[[str], int] = self._registered
        self.acks = acks or Acknowledgements()
        self._lock = threading.Condition()
        self._open: OpenEvaluation | None = None

    def receive(self, round: int, device_id: str, body: bytes) -> None:
        """Check a device's report and keep it; BadUpload or NotWanted say why not."""
        try:
            report = messages.decode(body, EvaluationReport)
        except ProtocolError as exc:
            raise BadUpload(f"bad evaluation report: {exc}") from None
        if len(report.confusion) != len(self.labels):
            raise BadUpload(f"confusion of {len(report.confusion)} classes; the task has {len(self.labels)}")
        confusion = np.array(report.confusion, dtype=np.int64)
        decisions = np.zeros((2, BINS), dtype=np.int64)  # a device that counts none calibrates nothing
        device = self.store.device(device_id)
        try:
            if device is None:
                raise ValueError("the device is not registered")
            check_counts(confusion, self.labels, device.test_counts, self.training(device_id))
            if report.decisions is not None:
                decisions = np.array(report.decisions, dtype=np.int64)
                check_decisions(decisions, confusion, self.labels)
        except ValueError as exc:
            log.warning("round %d: %s's evaluation report refused: %s", round, device_id, exc)
            raise BadUpload(f"evaluation report refused: {exc}") from None
        with self._lock:
            evaluation = self._open
            if evaluation is None or evaluation.round != round or report.round != round:
                raise NotWanted(f"round {round} is not being evaluated")
            task = evaluation.tasks.get(device_id)
            if task is None or report.task_id != task.task_id:
                raise NotWanted(f"no open evaluation {report.task_id!r} for {device_id}")
            if device_id in evaluation.reports:
                raise NotWanted(f"{device_id} already reported on round {round}")
            evaluation.reports[device_id] = Counts(confusion, report.loss_sum, decisions)
            self._lock.notify_all()

    def _registered(self, device_id: str) -> int:
        device = self.store.device(device_id)
        return device.num_samples if device is not None else 0

    def wake(self) -> None:
        """Have the evaluation look again at once whether it has all it waits for (a device failed a task)."""
        with self._lock:
            self._lock.notify_all()

    def run(
        self, round: int, tasks: dict[str, Task], deadline: float, stop: threading.Event
    ) -> Decisions | None:
        """Hand out the tasks, wait for the reports of devices there or the deadline, store the result;
        the reports' word decisions pooled (None without federated scores, or if no device counted any).
        """
        with self._lock:
            self._open = evaluation = OpenEvaluation(round, tasks)
        self.acks.expect(tasks.items())
        for device, task in tasks.items():
            self.link.publish_task(task, device)
        with self._lock:
            while not stop.is_set() and time.time() < deadline and not self._all_reported(evaluation):
                self._lock.wait(timeout=0.25)
            self._open = None
        self.acks.forget(task.task_id for task in tasks.values())
        for device in tasks:
            self.link.clear_task(device)
        result = combine(evaluation.reports, self.min_reports)
        scores = (result.accuracy, result.macro_f1, result.loss) if result else None
        self.store.save_evaluation(round, len(tasks), scores, result.devices if result else [])
        if result is None:
            log.warning(
                "round %d: %d of %d devices reported test clips, fewer than %d: no federated scores",
                round, len(evaluation.reports), len(tasks), max(1, self.min_reports),
            )  # fmt: skip
        else:
            log.info(
                "round %d: federated accuracy %.4f, macro-F1 %.4f, loss %.4f over %d clips of %d devices",
                round, result.accuracy, result.macro_f1, result.loss, result.clips, len(result.devices),
            )  # fmt: skip
        if result is None or not result.decisions.any():
            return None
        devices = f"{len(result.devices)} device{'s' if len(result.devices) > 1 else ''}"
        on = f"the test clips of {devices} (round {round}'s model)"
        return Decisions(result.decisions, on)

    def take_summed(self, round: int, tally: Tally, summed: Sequence[str]) -> Decisions | None:
        """A secure round's summed evaluation of round's model by its devices, stored as that round's
        federated scores (a disk that does not take them is logged); its word decisions pooled (None if
        the devices counted no test clip or no decision, or more than they all may: most_test_clips).
        """
        devices, clips = len(summed), int(tally.confusion.sum())
        if clips > (most := sum(most_test_clips(self.training(d)) for d in summed)):
            log.warning(
                "round %d's model: the summed evaluation of %d devices counts %d test clips, more than "
                "the %d their training clips make plausible: a device lied in its tally; it is not taken",
                round, devices, clips, most,
            )  # fmt: skip
            return None
        if clips == 0:
            return None
        result = scored(Counts(tally.confusion, tally.loss_sum, tally.decisions), [])
        try:
            scores = (result.accuracy, result.macro_f1, result.loss)
            self.store.save_evaluation(round, devices, scores, [], summed=(devices, result.clips))
        except StateWriteError as exc:
            log.error("%s; the round goes on without it", exc)
        log.info(
            "round %d's model, evaluated on the devices and summed securely: accuracy %.4f, macro-F1 %.4f "
            "over %d clips of %d devices", round, result.accuracy, result.macro_f1, result.clips, devices,
        )  # fmt: skip
        if not result.decisions.any():
            return None
        on = f"the test clips of {devices} devices, summed securely (round {round}'s model)"
        return Decisions(result.decisions, on)

    def _all_reported(self, evaluation: OpenEvaluation) -> bool:
        """Whether every device that is there (online, took its task in time, did not fail it) reported."""
        online, now = set(self.link.online()), time.time()
        return all(
            d in evaluation.reports or d not in online or self.acks.absent(task.task_id, now)
            for d, task in evaluation.tasks.items()
        )
