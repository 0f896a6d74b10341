"""Checking a device's decoded upload against its task: pure, so the orchestrator's lock is not held."""

from collections.abc import Mapping

from fedspeech.coordinator.errors import BadUpload
from fedspeech.coordinator.store import UpdateRecord
from fedspeech.coordinator.strategies import Result
from fedspeech.coordinator.update_metadata import (
    claimed_samples,
    local_steps,
    optional_number,
    predicted_counts,
)
from fedspeech.protocol import weights
from fedspeech.protocol.messages import Task
from fedspeech.protocol.weights import Arrays


def check_update(
    arrays: Arrays,
    meta: Mapping[str, str],
    reference: Arrays,
    task: Task,
    reported_samples: int,
    num_classes: int,
    digest: str,
    device_id: str,
) -> tuple[Result, UpdateRecord, int]:
    """The update's result, its record and the samples it claims; BadUpload if it does not fit.

    reference: the global model's arrays devices send, in float32. The update counts for at most
    reported_samples.
    """
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
            num_samples=min(claimed, reported_samples),
            train_loss=optional_number(meta, "train_loss"),
            train_seconds=optional_number(meta, "train_seconds"),
            sha256=digest,
        )
    except ValueError as exc:
        raise BadUpload(f"bad update: {exc}") from None
    if record.num_samples < 1:
        raise BadUpload("num_samples must be at least 1 (and the device must have reported its samples)")
    result = Result(device_id, arrays, record.num_samples, predicted_counts=counts, steps=steps)
    return result, record, claimed
