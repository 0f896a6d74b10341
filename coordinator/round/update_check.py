"""Checking a device's upload: the task it answers, and its decoded arrays against that task."""

from collections.abc import Mapping
from dataclasses import dataclass

from fedspeech.coordinator.refusals import BadUpload, NotWanted
from fedspeech.coordinator.round.late_updates import LateUpdates
from fedspeech.coordinator.round.open_round import OpenRound
from fedspeech.coordinator.round.update_metadata import (
    claimed_samples,
    local_steps,
    optional_number,
    predicted_counts,
)
from fedspeech.coordinator.state.records import UpdateRecord
from fedspeech.coordinator.strategies import Result
from fedspeech.protocol import weights
from fedspeech.protocol.messages import Task
from fedspeech.protocol.weights import Arrays


@dataclass(frozen=True)
class Upload:
    """A device's update as it came in, decoded: who sent it, its arrays and metadata, and its digest."""

    device_id: str
    arrays: Arrays
    meta: Mapping[str, str]
    digest: str


def answered_task(open_: OpenRound | None, late: LateUpdates, round: int, upload: Upload) -> Task:
    """The task an upload for a round answers: the open round's, or a buffered round's from an earlier one.

    NotWanted if it answers no task still wanted. The caller holds the lock that guards both.
    """
    device_id, meta = upload.device_id, upload.meta
    carried = late.task(device_id, round, meta.get("task_id"))
    if carried is not None:
        return carried
    if open_ is None or open_.round != round:
        raise NotWanted(f"round {round} is not open")
    task = open_.tasks.get(device_id)
    if task is None or meta.get("task_id") != task.task_id:
        raise NotWanted(f"no open task {str(meta.get('task_id'))[:80]!r} for {device_id}")
    if device_id in open_.updates:
        raise NotWanted(f"{device_id} already sent its update for round {round}")
    if device_id in open_.skipped:
        raise NotWanted(f"{device_id} is not the device training in its group now")
    refuse_when_full(open_, device_id)
    return task


def refuse_when_full(open_: OpenRound, device_id: str) -> None:
    """NotWanted if the round has the results it needs and the device is not one it waits for besides.

    A buffered round takes every result: one past the round's count is work done all the same.
    """
    full = open_.optional_results() >= open_.needed and device_id not in open_.required
    if full and not open_.buffered:
        raise NotWanted(f"round {open_.round} already has the {open_.needed} results it needs")


def expected_task(open_: OpenRound | None, late: LateUpdates, round: int, device_id: str) -> Task:
    """The task a device's upload for a round can answer, known before the upload is read: a task of its
    for that round that has no update yet. NotWanted if there is none. The caller holds the lock that
    guards both.
    """
    carried = late.carried.get(device_id)
    if carried is not None and carried.round == round:
        return carried
    if open_ is None or open_.round != round:
        raise NotWanted(f"round {round} is not open")
    task = open_.tasks.get(device_id)
    if task is None:
        raise NotWanted(f"{device_id} has no open task in round {round}")
    if device_id in open_.updates:
        raise NotWanted(f"{device_id} already sent its update for round {round}")
    return task


def check_update(
    upload: Upload, task: Task, *, reference: Arrays, most_samples: int, num_classes: int
) -> tuple[Result, UpdateRecord, int]:
    """The update's result, its record and the samples it claims; BadUpload if it does not fit its task.

    Pure, so that the Uploads lock is not held while it runs. reference: the global model's arrays
    devices send, in float32. The update counts for at most most_samples (influence.sample_ceiling).
    """
    arrays, meta, device_id = upload.arrays, upload.meta, upload.device_id
    try:
        # in the task's precision, then widened: aggregation always runs in float32
        weights.check_like(arrays, weights.with_precision(reference, task.precision))
        arrays = weights.with_precision(arrays, "float32")
        claimed = claimed_samples(meta)
        counts = predicted_counts(meta, num_classes)
        # no more steps than the task's epochs over the samples claimed, one sample a batch
        steps = local_steps(meta, task.epochs * max(claimed, 1))
        record = UpdateRecord(
            device_id=device_id,
            num_samples=min(claimed, most_samples),
            train_loss=optional_number(meta, "train_loss"),
            train_seconds=optional_number(meta, "train_seconds"),
            sha256=upload.digest,
        )
    except ValueError as exc:
        raise BadUpload(f"bad update: {exc}") from None
    if record.num_samples < 1:
        raise BadUpload("num_samples must be at least 1 (and the device must have registered its samples)")
    result = Result(device_id, arrays, record.num_samples, predicted_counts=counts, steps=steps)
    return result, record, claimed
