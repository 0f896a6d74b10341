"""What the device does with one task it is sent: train or evaluate on its own clips, upload the result.

It drops a task whose deadline passed while it was queued, that the coordinator withdrew, or whose model
does not fit its task; it reads its data folder again first and registers anew if its clip counts changed;
under secure aggregation it agrees keys with the round's other devices before training and sends its change
and its tally masked. A task that fails is reported to the coordinator at once, unless it is no longer
wanted anyway; whatever happens the device reports itself online again afterwards. The daemon
(edge_client.daemon) receives the tasks and builds the Device this works with.
"""

import functools
import logging
import time
from dataclasses import dataclass

import numpy as np

from fedspeech.edge_client.coordinator_http import CoordinatorClient
from fedspeech.edge_client.credentials import Refused
from fedspeech.edge_client.local_data import LocalData
from fedspeech.edge_client.mqtt_link import BrokerLink
from fedspeech.edge_client.profile import measure_profile, measure_rtt_ms
from fedspeech.edge_client.secure_sum_client import SecureUpload
from fedspeech.edge_client.trainer import Trainer, TrainingStopped, UnknownSetting, training_settings
from fedspeech.protocol import weights
from fedspeech.protocol.messages import DeviceStatus, ModelSpec, Profile, State, Task, TaskDefinition
from fedspeech.protocol.secure_tally import Tally
from fedspeech.runtime.http_requests import Dropped, Unwanted

log = logging.getLogger(__name__)


@dataclass
class Device:
    """What the main loop works with; the link's MQTT thread only fills its queue and offers models."""

    device_id: str
    coordinator_url: str  # as configured: its round-trip time is measured to it
    http: CoordinatorClient
    data: LocalData
    trainer: Trainer
    link: BrokerLink
    profile: Profile
    registered: tuple[int, dict[str, int]]  # the training clips and test clips per label it registered
    # the coordinator runs secure aggregation: the clips per label go only into its sums, never alone
    private: bool = False


def device_status(device: Device, state: State, round: int | None = None) -> DeviceStatus:
    """The device's status: its profile and clips per label (counts only; none under secure aggregation)."""
    data, private = device.data, device.private
    return DeviceStatus(
        device.device_id,
        state,
        data.train.clips,
        device.profile,
        round,
        train_counts={} if private else data.train.counts,
        test_counts={} if private else data.test.counts,
    )


def clip_counts(data: LocalData, private: bool) -> tuple[int, dict[str, int]]:
    """The device's training clips and its test clips per label (none if private), as it registers them."""
    return data.train.clips, {} if private else dict(data.test.counts)


def register_again(device: Device) -> bool:
    """Register with the current counts (the coordinator counts no more than these); False if stopped."""
    counts = clip_counts(device.data, device.private)
    if not device.http.register(counts[0], device.profile, counts[1]):
        return False
    device.registered = counts
    return True


def do_task(device: Device, task: Task) -> None:
    """Train or evaluate one task and upload the result; whatever happens, report online again afterwards."""
    trained = None
    secure: SecureUpload | None = None
    failure: str | None = None  # why the task could not be done, for the coordinator
    try:
        if task.deadline < time.time():
            raise Unwanted("its deadline passed while it was queued")
        _check_wanted(device, task)
        _check_consistent(task.spec, task.definition)
        device.data.refresh(task.definition)  # recordings added since the last task count now
        if clip_counts(device.data, device.private) != device.registered and not register_again(device):
            raise Dropped("stopped while registering its new clip counts")
        if task.action == "train":
            training_settings(task)  # refused before anything is downloaded
        busy: State = "training" if task.action == "train" else "evaluating"
        device.link.publish_status(device_status(device, busy, task.round))
        blob = device.http.fetch(task.weights)
        arrays = weights.with_precision(weights.decode(blob)[0], "float32")  # float16 on the wire, perhaps
        if task.action == "evaluate":
            body = device.trainer.evaluate(task, arrays, device.data.test, device.data.train)
            content_type = "application/json"
        else:
            if device.data.train.clips == 0:
                raise Dropped("no usable training clips")
            if task.secure_sum is not None:  # keys agreed with the round's other devices before training
                secure = SecureUpload(device.http, task, device.http.credentials.identity)
                secure.agree()
                tally = _tally(device, task, arrays)  # the model received, scored before it is trained
            # mutual knowledge distillation: the server model's arrays, fetched like the weights
            teacher = weights.decode(device.http.fetch(task.teacher))[0] if task.teacher else None
            trained, body = device.trainer.train(task, arrays, device.data.train, teacher)
            content_type = "application/octet-stream"
        _check_wanted(device, task)
        if secure is not None:  # the change goes into the round's sum, masked: the upload is not sent
            sent = secure.send(arrays, weights.decode(body)[0], tally)
        else:
            register = functools.partial(register_again, device)
            device.http.upload(task.upload_path, body, content_type, task.deadline, register)
            sent = len(body)
        if trained is None:
            log.info("round %d evaluated on %d test clips", task.round, len(device.data.test.labels))
        else:
            log.info(
                "round %d done: %d samples, loss %.4f, %.1f s, %d B down, %d B up",
                task.round, trained.num_samples, trained.loss, trained.seconds, len(blob), sent,
            )  # fmt: skip
    except (Unwanted, TrainingStopped) as exc:  # withdrawn, past its deadline, or the daemon is stopping
        log.warning("dropping task %s of round %d: %s", task.task_id, task.round, exc)
    except (Dropped, weights.WeightsError, UnknownSetting, OSError) as exc:  # OSError: the data folder's
        log.warning("dropping task %s of round %d: %s", task.task_id, task.round, exc)
        failure = str(exc)
    except Refused:
        raise  # the coordinator no longer takes this device: it stops
    except Exception as exc:
        log.exception("task %s of round %d failed", task.task_id, task.round)
        failure = f"{type(exc).__name__}: {exc}"
    if device.http.stop.is_set():
        return  # going offline
    if failure is not None:
        device.http.report_failure(task, failure)
    if trained is not None:  # a training run measured this device's speed on the real model
        rtt_ms = measure_rtt_ms(device.coordinator_url, context=device.http.context)
        device.profile = measure_profile(trained.seconds_per_sample, rtt_ms)
    device.link.publish_status(device_status(device, "online"))


def _tally(device: Device, task: Task, arrays: weights.Arrays) -> Tally:
    """What this device adds to a secure sum besides its change: its clips per label, and its
    evaluation of the model it was sent on its test clips.
    """
    counts = device.data.train.counts
    confusion, loss_sum, decisions = device.trainer.evaluation_counts(
        task, arrays, device.data.test, device.data.train
    )
    train = np.array([counts.get(label, 0) for label in task.definition.labels])
    return Tally(train, confusion, decisions, loss_sum)


def _check_wanted(device: Device, task: Task) -> None:
    """Raise Unwanted if the coordinator withdrew the task (its round took the results it needed)."""
    if device.link.withdrawn(task):
        raise Unwanted("the coordinator withdrew it: its round closed")


def _check_consistent(spec: ModelSpec, definition: TaskDefinition) -> None:
    """Raise Dropped unless the model fits the task it is sent with."""
    expected = (definition.sample_rate, definition.num_samples, len(definition.labels))
    if (spec.sample_rate, spec.num_samples, spec.num_classes) != expected:
        raise Dropped(f"its model ({spec}) does not fit its task {definition.name!r}")
