"""The fleet at a glance: devices, rounds and the current model, for the dashboard and `fedspeech status`."""

import functools
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedspeech.coordinator.broker.mqtt_link import CoordinatorLink
from fedspeech.coordinator.round.acknowledgements import DeviceError
from fedspeech.coordinator.round.evaluation import outlying
from fedspeech.coordinator.round.new_model import FIRST_MODEL_KEY
from fedspeech.coordinator.round.orchestrator import Orchestrator
from fedspeech.coordinator.round.upload_outcomes import Outcome, UploadOutcomes
from fedspeech.coordinator.state.records import RoundRecord
from fedspeech.coordinator.state.store import Store
from fedspeech.coordinator.strategies.selection import hardware_scores
from fedspeech.protocol import onnx_metadata as meta
from fedspeech.protocol import routes, weights
from fedspeech.protocol.labels import none_class
from fedspeech.protocol.messages import DeviceStatus, TaskDefinition

MAX_ROUNDS = 1000  # the latest rounds an overview lists: enough for the curves of any run worth plotting


@dataclass(frozen=True)
class ReportView:
    """A device's evaluation report on a round's model, and whether it lies far from the others'."""

    round: int
    accuracy: float
    clips: int
    others_median: float | None  # the other reports' median accuracy where this one is far from it


@dataclass(frozen=True)
class DeviceView:
    """A device as the operator sees it."""

    device_id: str
    state: str  # its latest MQTT status (online, training, evaluating, offline), 'unknown' before any
    online: bool
    registered: bool  # it holds a token
    enrolled: bool  # the operator gave it an enrolment secret
    num_samples: int
    profile: dict[str, Any]  # as it measured its hardware, latest first: MQTT status, else registration
    score: float | None  # its hardware score among the devices online now; None while offline
    last_seen: float | None  # when its latest MQTT status arrived (Unix time)
    rounds_joined: int  # rounds whose model its update went into
    last_update: Outcome | None  # its latest upload since the coordinator started
    # the last task it reported it could not do, since the coordinator started; None once an upload of its
    # was accepted after it
    last_error: DeviceError | None
    train_counts: dict[str, int]
    test_counts: dict[str, int]
    last_report: ReportView | None = None  # its report on the latest model the devices evaluated
    # the task's labels it holds no clip of (train or test); None where it gave no counts
    missing_labels: list[str] | None = None


@dataclass(frozen=True)
class ModelView:
    """The latest global model."""

    round: int
    architecture: str
    depth: int | None
    weights_bytes: int
    onnx_bytes: int | None
    onnx_url: str | None  # where it downloads
    threshold: float | None  # its detection threshold, as its ONNX model carries it (None: uncalibrated)
    threshold_from: str | None  # on which clips it was calibrated, or why it was not


@dataclass(frozen=True)
class Overview:
    """Everything the dashboard shows, in one reply."""

    at: float
    task: str
    strategy: str
    # what the coordinator sees of an update ("secure aggregation" or "updates in the clear"), and the
    # differential privacy spent, where a strategy gives it
    privacy: str
    # under secure aggregation, the clips per label of the latest round's devices, learnt only summed
    # (no device's own counts are shown); empty otherwise
    fleet_counts: dict[str, int]
    completed_round: int | None
    open_round: int | None
    target_rounds: int
    finished: bool
    devices_online: int
    waiting: str | None  # what keeps the next round from starting, and how to change it; None if nothing
    devices: list[DeviceView]
    rounds: list[RoundRecord]  # oldest first, the latest MAX_ROUNDS
    model: ModelView | None
    first_model: str | None = None  # how round 0's model was made, in words; None where not known


def overview(
    store: Store,
    link: CoordinatorLink,
    orchestrator: Orchestrator,
    outcomes: UploadOutcomes,
) -> Overview:
    """The overview of the coordinator's state now."""
    statuses, seen, last = link.statuses(), link.last_seen(), outcomes.last()
    errors = orchestrator.uploads.last_errors()
    joined = store.rounds_joined()
    known = store.devices()
    registered = {d.device_id for d in known if d.registered}
    online = {d for d in link.online() if d in registered}
    profiles = {d: s.profile for d, s in statuses.items() if d in online and s.profile is not None}
    scores = hardware_scores(profiles, penalties=getattr(orchestrator.strategy, "penalties", None))
    devices, private = [], orchestrator.config.secure_aggregation
    stored = store.rounds()
    rounds = stored[-MAX_ROUNDS:]
    definition = orchestrator.model.definition
    reports = last_reports(store, rounds)
    for device in known:
        status = statuses.get(device.device_id)
        profile = asdict(status.profile) if status and status.profile else device.profile
        devices.append(
            DeviceView(
                device_id=device.device_id,
                state=status.state if status else "unknown",
                online=device.device_id in online,
                registered=device.registered,
                enrolled=device.enrolled,
                num_samples=status.num_samples if status and status.num_samples else device.num_samples,
                profile=profile,
                score=scores.get(device.device_id),
                last_seen=seen.get(device.device_id),
                rounds_joined=joined.get(device.device_id, 0),
                last_update=last.get(device.device_id),
                last_error=standing(errors.get(device.device_id), last.get(device.device_id)),
                train_counts=status.train_counts if status and not private else {},
                test_counts=status.test_counts if status and not private else {},
                last_report=reports.get(device.device_id),
                missing_labels=None if private else missing_labels(definition, status),
            )
        )
    latest = rounds[-1] if rounds else None
    return Overview(
        at=time.time(),
        task=orchestrator.model.definition.name,
        strategy=orchestrator.strategy.name,
        privacy=_privacy(orchestrator.config.secure_aggregation, rounds),
        fleet_counts=orchestrator.fleet_counts,
        completed_round=latest.round if latest else None,
        open_round=orchestrator.uploads.open_round(),
        target_rounds=orchestrator.config.rounds,
        finished=orchestrator.finished.is_set(),
        devices_online=len(online),
        waiting=orchestrator.waiting,
        devices=devices,
        rounds=rounds,
        model=_model(store, orchestrator, latest) if latest else None,
        first_model=first_model(store) if stored and stored[0].round == 0 else None,
    )


def first_model(store: Store) -> str | None:
    """How round 0's model was made, in words, as its weights record it; None where they do not."""
    try:
        return weights.read_metadata(store.model_path(0, "weights")).get(FIRST_MODEL_KEY)
    except (OSError, weights.WeightsError):
        return None


def standing(error: DeviceError | None, update: Outcome | None) -> DeviceError | None:
    """A device's last error, unless an upload of its was accepted after it: then it has recovered."""
    if error is None or (update is not None and update.accepted and update.at > error.at):
        return None
    return error


def missing_labels(definition: TaskDefinition, status: DeviceStatus | None) -> list[str] | None:
    """The task's labels a device's latest status counts no clip of; None where it gave no counts.

    The none class is left out: training fills it with background windows, which the counts do not hold.
    """
    if status is None or not (status.train_counts or status.test_counts):
        return None
    none = none_class(definition.labels)
    return [
        label
        for i, label in enumerate(definition.labels)
        if i != none and not status.train_counts.get(label) and not status.test_counts.get(label)
    ]


def _model(store: Store, orchestrator: Orchestrator, latest: RoundRecord) -> ModelView:
    spec = orchestrator.uploads.current_spec()
    onnx = store.model_path(latest.round, "onnx")
    has_onnx = latest.onnx_sha256 is not None and onnx.exists()
    threshold, threshold_from = _threshold(onnx, latest.onnx_sha256) if has_onnx else (None, None)
    return ModelView(
        round=latest.round,
        architecture=spec.name,
        depth=spec.depth,
        weights_bytes=store.model_path(latest.round, "weights").stat().st_size,
        onnx_bytes=onnx.stat().st_size if has_onnx else None,
        onnx_url=routes.model(latest.round, "onnx") if has_onnx else None,
        threshold=threshold,
        threshold_from=threshold_from,
    )


@functools.lru_cache(maxsize=4)
def _threshold(path: Path, sha256: str | None) -> tuple[float | None, str | None]:
    """The threshold an ONNX file carries and where it came from (read once per file, by its digest)."""
    import onnx

    try:
        metadata = {p.key: p.value for p in onnx.load_model(path, load_external_data=False).metadata_props}
    except Exception:  # protobuf's DecodeError, or OSError: not an ONNX model after all, so no threshold
        return None, None
    threshold = metadata.get(meta.THRESHOLD)
    return (float(threshold) if threshold else None), metadata.get(meta.THRESHOLD_FROM)


def _privacy(secure: bool, rounds: list[RoundRecord]) -> str:
    """What the coordinator sees of an update, and the differential privacy spent by the latest round."""
    text = "secure aggregation" if secure else "updates in the clear"
    spent = [r for r in rounds if r.dp_epsilon is not None]
    if spent:
        text += f", differential privacy: epsilon {spent[-1].dp_epsilon:.3g} at delta {spent[-1].dp_delta:g}"
    return text


def last_reports(store: Store, rounds: list[RoundRecord]) -> dict[str, ReportView]:
    """Each device's report on the latest of the rounds' models the devices evaluated one by one, far ones
    flagged.
    """
    evaluated = [r for r in rounds if r.evaluation_reports and r.federated_accuracy is not None]
    if not evaluated:
        return {}
    round = evaluated[-1].round
    reports = {e.device_id: e for e in store.device_evaluations(round) if e.clips}
    far = outlying({d: e.accuracy for d, e in reports.items()})
    return {d: ReportView(round, e.accuracy, e.clips, far.get(d)) for d, e in reports.items()}
