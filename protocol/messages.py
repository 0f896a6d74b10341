"""Versioned JSON messages of the control plane and the HTTP API, with validation."""

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal, TypeVar

import dacite

from fedspeech.protocol import routes
from fedspeech.protocol.labels import none_class
from fedspeech.protocol.weights import Precision

SCHEMA_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024
DEVICE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")  # not "." or "..": it names a folder
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")  # task names and labels: also safe as folder names
MAX_LABELS = 64
MAX_NEGATIVES, MAX_NEGATIVE_CHARS = 16, 100  # a task's negatives: paths inside a device's data folder
MAX_CONFIG = 16  # training settings a task may carry
MAX_COUNT = 10**9  # bound on any count a device reports
SAMPLE_RATES = (4_000, 48_000)
MIN_CLIP_SECONDS, MAX_CLIP_SECONDS = 0.1, 10.0
MAX_BLOB_BYTES = 64 * 1024 * 1024  # a model's weights or ONNX file, and a device's upload
# what a task may ask of a device: an attacker's task must not keep it busy for ever
MAX_EPOCHS, MAX_BATCH_SIZE, MAX_LEARNING_RATE = 100, 1024, 10.0
MAX_TASK_SECONDS = 6 * 3600  # from the moment a device receives a task to its deadline
MAX_DEPTH = 64
TASK_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
TOKEN = re.compile(r"^[A-Za-z0-9_-]{16,128}\Z")
SHA256 = re.compile(r"^[0-9a-f]{64}\Z")


class ProtocolError(ValueError):
    """A message that does not follow the contract; the text says why."""


@dataclass(frozen=True)
class BlobRef:
    """A file on the coordinator: path relative to its base URL, sha256 hex digest, size in bytes."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ModelSpec:
    """What a device needs to build the model: architecture name and input/output sizes."""

    name: str
    sample_rate: int
    num_samples: int
    num_classes: int
    depth: int | None = None


@dataclass(frozen=True)
class TaskDefinition:
    """What a fleet learns: the labels (also the names of a device's data folders), rate and clip length.

    negatives are folders (or single clips) inside each device's data folder whose clips train the task's
    none class (protocol.labels.none_class).
    """

    name: str
    labels: list[str]
    sample_rate: int
    clip_seconds: float
    negatives: list[str] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        """Samples in one clip."""
        return round(self.sample_rate * self.clip_seconds)


@dataclass(frozen=True)
class TaskInfo:
    """HTTP reply to GET /api/task: what the fleet learns and the model it trains, for a starting device."""

    definition: TaskDefinition
    spec: ModelSpec


@dataclass(frozen=True)
class Profile:
    """A device's hardware as it measures it now: H_i = (CPU_i, RAM_i, T_i, L_i) and context."""

    cpu_count: int
    cpu_freq_mhz: float
    ram_available_mb: float
    cpu_gflops: float | None = None  # CPU_i: measured throughput of a short fixed benchmark
    seconds_per_sample: float | None = None  # T_i: from the last local training
    rtt_ms: float | None = None  # L_i: round trip to the coordinator


@dataclass(frozen=True)
class Registration:
    """HTTP body a device posts to join: its id, how much data it holds, its profile."""

    device_id: str
    num_samples: int
    profile: Profile


@dataclass(frozen=True)
class Credentials:
    """HTTP reply to a registration: the device's bearer token and the key the coordinator signs with.

    coordinator_key is the Ed25519 public key (base64) of the tasks' and announcements' signatures.
    """

    device_id: str
    token: str
    coordinator_key: str


State = Literal["online", "training", "evaluating", "offline"]


@dataclass(frozen=True)
class DeviceStatus:
    """Retained status of a device; 'offline' is also its last will."""

    device_id: str
    state: State
    num_samples: int = 0
    profile: Profile | None = None
    round: int | None = None
    train_counts: dict[str, int] = field(default_factory=dict)  # usable local clips per label
    test_counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """Work for one device in one round: train the model from these weights, or evaluate them.

    An evaluation uploads an EvaluationReport of the device's test split; the training fields are unused.
    """

    task_id: str
    round: int
    spec: ModelSpec
    definition: TaskDefinition
    weights: BlobRef
    upload_path: str
    epochs: int
    batch_size: int
    learning_rate: float
    deadline: float
    seed: int = 0
    # the strategy's training settings by name: numbers, or lists of numbers (a class distribution)
    config: dict[str, float | list[float]] = field(default_factory=dict)
    action: Literal["train", "evaluate"] = "train"
    teacher: BlobRef | None = None  # a server model whose soft labels the device distils (mutual KD)
    # the floating-point type of the weights downloaded and of the update uploaded
    precision: Precision = "float32"


@dataclass(frozen=True)
class EvaluationReport:
    """What a device sends back for an evaluation: counts only, never audio or file names.

    confusion[i][j] counts its test clips of true class i predicted as j; loss_sum is the summed
    cross-entropy over them.
    """

    task_id: str
    round: int
    confusion: list[list[int]]
    loss_sum: float


@dataclass(frozen=True)
class ModelAnnouncement:
    """Retained announcement of a new global model."""

    round: int
    spec: ModelSpec
    labels: list[str]
    weights: BlobRef
    onnx: BlobRef | None = None
    metrics: dict[str, float] = field(default_factory=dict)


M = TypeVar("M")

_KINDS: dict[type, str] = {
    Registration: "registration",
    Credentials: "credentials",
    DeviceStatus: "status",
    Task: "task",
    ModelAnnouncement: "model",
    TaskInfo: "task_info",
    EvaluationReport: "evaluation",
}


def _float_hook(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"expected a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        raise ProtocolError("number out of range") from None


def _int_hook(value: Any) -> Any:
    # an integer of hundreds of digits would overflow the maths it feeds; dacite checks the type after
    if isinstance(value, int) and abs(value) > 2**53:
        raise ProtocolError(f"an integer of {len(str(abs(value)))} digits is out of range")
    return value


_CONFIG = dacite.Config(strict=False, type_hooks={float: _float_hook, int: _int_hook}, cast=[])


def encode(message: Any) -> bytes:
    """Serialise a message to JSON bytes with its kind and schema version."""
    body = {"v": SCHEMA_VERSION, "kind": _KINDS[type(message)], **asdict(message)}
    return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()


def _reject_constant(name: str) -> float:
    raise ProtocolError(f"non-finite number {name}")


def decode(payload: bytes | bytearray | str, kind: type[M]) -> M:
    """Parse and validate a message of the given kind; raise ProtocolError with the reason."""
    if len(payload) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(payload)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        body = json.loads(payload, parse_constant=_reject_constant)
    except ValueError as exc:  # also UnicodeDecodeError, JSONDecodeError, an integer of > 4300 digits
        raise ProtocolError(f"not JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise ProtocolError("message is not a JSON object")
    if body.get("v") != SCHEMA_VERSION:
        raise ProtocolError(f"schema version {body.get('v')!r}, expected {SCHEMA_VERSION}")
    if body.get("kind") != _KINDS[kind]:
        raise ProtocolError(f"kind {body.get('kind')!r}, expected {_KINDS[kind]!r}")
    try:
        message = dacite.from_dict(kind, body, config=_CONFIG)
    except (dacite.DaciteError, ValueError, TypeError) as exc:  # dacite's dict() of a list, for one
        raise ProtocolError(str(exc)) from None
    _check_values(message)
    return message


def _check_values(message: Any) -> None:
    """Range checks that types alone do not express."""
    device_id = getattr(message, "device_id", None)
    if device_id is not None and not DEVICE_ID.match(device_id):
        raise ProtocolError(f"bad device id {device_id!r}")
    for name in ("num_samples", "round"):
        value = getattr(message, name, None)
        if value is not None and not 0 <= value <= MAX_COUNT:
            raise ProtocolError(f"{name} must be between 0 and {MAX_COUNT}")
    task_id = getattr(message, "task_id", None)
    if task_id is not None and not TASK_ID.match(task_id):
        raise ProtocolError(f"bad task id {task_id[:80]!r}")
    spec, profile = getattr(message, "spec", None), getattr(message, "profile", None)
    if spec is not None:
        _check_spec(spec)
    if profile is not None:
        _check_profile(profile)
    if isinstance(message, Task):
        _check_task(message)
    definition = getattr(message, "definition", None)
    if definition is not None:
        check_definition(definition)
    if isinstance(message, Credentials) and not TOKEN.match(message.token):
        raise ProtocolError("bad token")
    if isinstance(message, ModelAnnouncement):
        _check_announcement(message)
    if isinstance(message, DeviceStatus):
        for counts in (message.train_counts, message.test_counts):
            _check_counts(counts)
    if isinstance(message, EvaluationReport):
        _check_confusion(message)


def check_definition(definition: TaskDefinition) -> None:
    """ProtocolError unless the task's name, labels, rate and clip length are usable and bounded."""
    if not NAME.match(definition.name):
        raise ProtocolError(f"name: {definition.name!r}: use letters, digits, '_', '.' or '-' (at most 64)")
    labels = definition.labels
    if not 2 <= len(labels) <= MAX_LABELS:
        raise ProtocolError(f"labels: between 2 and {MAX_LABELS} are needed, got {len(labels)}")
    for label in labels:
        if not NAME.match(label):
            raise ProtocolError(f"labels: {label!r} is not a folder name (letters, digits, '_', '.', '-')")
    if len(set(labels)) != len(labels):
        raise ProtocolError(f"labels: repeated {sorted({x for x in labels if labels.count(x) > 1})}")
    low, high = SAMPLE_RATES
    if not low <= definition.sample_rate <= high:
        raise ProtocolError(f"sample_rate: must be between {low} and {high} Hz, got {definition.sample_rate}")
    seconds = definition.clip_seconds
    if not (math.isfinite(seconds) and MIN_CLIP_SECONDS <= seconds <= MAX_CLIP_SECONDS):
        limits = f"{MIN_CLIP_SECONDS} and {MAX_CLIP_SECONDS}"
        raise ProtocolError(f"clip_seconds: must be between {limits}, got {seconds}")
    _check_negatives(definition.negatives, labels)


def _check_negatives(negatives: list[str], labels: list[str]) -> None:
    """ProtocolError unless each negative is a short relative path inside a data folder, not a label's."""
    if len(negatives) > MAX_NEGATIVES:
        raise ProtocolError(f"negatives: at most {MAX_NEGATIVES}, got {len(negatives)}")
    if negatives and none_class(labels) is None:
        raise ProtocolError("negatives: they train a none class, and the labels have no _none_ or _silence_")
    for negative in negatives:
        path = PurePosixPath(negative)
        if not (0 < len(negative) <= MAX_NEGATIVE_CHARS and negative.isprintable()):
            limit = f"1 to {MAX_NEGATIVE_CHARS} printable characters"
            raise ProtocolError(f"negatives: {negative[:40]!r} must be {limit}")
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise ProtocolError(f"negatives: {negative!r} must be a path inside the data folder, no '..'")
        if path.parts[0] in labels:
            raise ProtocolError(f"negatives: {negative!r} is in the folder of label {path.parts[0]!r}")


def _check_size(ref: BlobRef, kind: str) -> None:
    if not SHA256.match(ref.sha256) or not 0 < ref.size <= MAX_BLOB_BYTES:
        raise ProtocolError(f"bad {kind} reference: sha256 of 64 hex digits, size 1 to {MAX_BLOB_BYTES}")


def _check_blob(ref: BlobRef, kind: str) -> int:
    """The round a blob of a kind ('weights', 'onnx') belongs to; ProtocolError unless it is well formed."""
    _check_size(ref, kind)
    try:
        return routes.model_round(ref.path, kind)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None


def _check_weights(task: "Task") -> None:
    """ProtocolError unless a task trains a global model of its round or before, or one relayed in it."""
    ref = task.weights
    if not ref.path.startswith(routes.PREFIX + "/rounds/"):
        if _check_blob(ref, "float16" if task.precision == "float16" else "weights") > task.round:
            raise ProtocolError("a task's weights must come from its round or an earlier one")
        return
    _check_size(ref, "relay")
    try:
        relay_round = routes.relay_round(ref.path)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    if relay_round != task.round:
        raise ProtocolError(f"an update relayed in round {relay_round} in a task of round {task.round}")


def _check_task(task: "Task") -> None:
    if not (1 <= task.epochs <= MAX_EPOCHS and 1 <= task.batch_size <= MAX_BATCH_SIZE):
        raise ProtocolError(f"epochs must be 1 to {MAX_EPOCHS} and batch_size 1 to {MAX_BATCH_SIZE}")
    if not (math.isfinite(task.learning_rate) and 0 < task.learning_rate <= MAX_LEARNING_RATE):
        raise ProtocolError(f"learning_rate must be above 0 and at most {MAX_LEARNING_RATE}")
    if not math.isfinite(task.deadline):
        raise ProtocolError("deadline must be a finite time")
    # the model trained in a round is the one the previous round produced; an evaluation, the round's own;
    # inside a group trained one device after another, the update of the device before
    _check_weights(task)
    if task.teacher is not None and _check_blob(task.teacher, "teacher") > task.round:
        raise ProtocolError("a task's teacher must come from its round or an earlier one")
    kind = "updates" if task.action == "train" else "evaluations"
    try:
        upload_round = routes.result_round(task.upload_path, kind)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    if upload_round != task.round:
        raise ProtocolError(f"upload path of round {upload_round} in a task of round {task.round}")
    _check_config(task.config)


def _check_announcement(announcement: "ModelAnnouncement") -> None:
    refs = [("weights", announcement.weights)] + ([("onnx", announcement.onnx)] if announcement.onnx else [])
    for kind, ref in refs:
        if _check_blob(ref, kind) != announcement.round:
            raise ProtocolError(
                f"the {kind} of another round in the announcement of round {announcement.round}"
            )
    if not 2 <= len(announcement.labels) <= MAX_LABELS or not all(NAME.match(x) for x in announcement.labels):
        raise ProtocolError(f"labels: 2 to {MAX_LABELS} names of letters, digits, '_', '.', '-'")
    if len(announcement.metrics) > MAX_CONFIG:
        raise ProtocolError(f"more than {MAX_CONFIG} metrics")
    _check_config(announcement.metrics)


def _check_spec(spec: "ModelSpec") -> None:
    low, high = SAMPLE_RATES
    if (
        not NAME.match(spec.name)
        or not low <= spec.sample_rate <= high
        or not 2 <= spec.num_classes <= MAX_LABELS
    ):
        raise ProtocolError(f"bad model spec {spec}")
    if not 1 <= spec.num_samples <= high * MAX_CLIP_SECONDS or not (
        spec.depth is None or 1 <= spec.depth <= MAX_DEPTH
    ):
        raise ProtocolError(f"bad model spec {spec}")


def _check_profile(profile: "Profile") -> None:
    values = [profile.cpu_freq_mhz, profile.ram_available_mb, profile.cpu_gflops, profile.seconds_per_sample]
    values.append(profile.rtt_ms)
    if not 1 <= profile.cpu_count <= 4096 or any(v is not None and not 0 <= v <= 1e9 for v in values):
        raise ProtocolError("profile values out of range")


def _check_config(config: Mapping[str, float | list[float]]) -> None:
    if len(config) > MAX_CONFIG:
        raise ProtocolError(f"config has {len(config)} settings, more than {MAX_CONFIG}")
    for name, value in config.items():
        values = value if isinstance(value, list) else [value]
        if not NAME.match(name) or len(values) > MAX_LABELS or not all(math.isfinite(v) for v in values):
            raise ProtocolError(f"bad config setting {name!r}: {str(value)[:80]}")


def _check_counts(counts: dict[str, int]) -> None:
    if len(counts) > MAX_LABELS:
        raise ProtocolError(f"counts for {len(counts)} labels, more than {MAX_LABELS}")
    for label, count in counts.items():
        if not NAME.match(label) or not 0 <= count <= MAX_COUNT:
            raise ProtocolError(f"bad count {count!r} for label {label!r}")


def _check_confusion(report: EvaluationReport) -> None:
    size = len(report.confusion)
    if not 2 <= size <= MAX_LABELS or any(len(row) != size for row in report.confusion):
        raise ProtocolError(f"confusion must be a square matrix of 2 to {MAX_LABELS} classes")
    if any(not 0 <= count <= MAX_COUNT for row in report.confusion for count in row):
        raise ProtocolError(f"confusion counts must be between 0 and {MAX_COUNT}")
    if not (math.isfinite(report.loss_sum) and report.loss_sum >= 0):
        raise ProtocolError("loss_sum must be a finite number, not negative")
