"""Versioned JSON messages of the control plane and the HTTP API, checked as they are decoded."""

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

import dacite

from fedspeech.protocol import message_checks
from fedspeech.protocol.bounds import DEVICE_ID, MAX_COUNT, TASK_ID, TOKEN, ProtocolError
from fedspeech.protocol.weights import Precision

SCHEMA_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024


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
    none class (protocol.labels.none_class). say gives how a label is spoken, where its name does not
    say it (synthetic speech).
    """

    name: str
    labels: list[str]
    sample_rate: int
    clip_seconds: float
    negatives: list[str] = field(default_factory=list)
    say: dict[str, str] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        """Samples in one clip."""
        return round(self.sample_rate * self.clip_seconds)


@dataclass(frozen=True)
class TaskInfo:
    """HTTP reply to GET /api/task: what the fleet learns and the model it trains, for a starting device."""

    definition: TaskDefinition
    spec: ModelSpec
    # the coordinator learns only sums: a device keeps its clips per label out of what it sends alone
    secure_aggregation: bool = False


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
    """HTTP body a device posts to join: its id, how much data it holds, its profile.

    num_samples (its training clips) bounds the weight of its updates, and test_counts (its test clips
    per label) the counts of its evaluation reports: the coordinator trusts no larger number.
    """

    device_id: str
    num_samples: int
    profile: Profile
    test_counts: dict[str, int] = field(default_factory=dict)
    # the device's identity key (Ed25519, base64), which signs its keys in a secure-sum round
    identity_key: str | None = None


@dataclass(frozen=True)
class Credentials:
    """HTTP reply to a registration: the device's bearer token and the key the coordinator signs with.

    coordinator_key is the Ed25519 public key (base64) of the tasks' and announcements' signatures. Where
    the coordinator keeps the broker's users (`fedspeech broker-config`), the device's broker password
    (user: its id) and its listener's (user: <id>-listen) come with them; None elsewhere.
    """

    device_id: str
    token: str
    coordinator_key: str
    broker_password: str | None = None
    listen_password: str | None = None


@dataclass(frozen=True)
class SecureSum:
    """How a device takes part in its round's secure sum: how many of the round's devices rebuild a
    secret, how many there are (the fixed point's range), the L2 norm its change is clipped to, its
    weight in the sum (its training clips against the round's most), how long past the task's deadline
    the sum may take to unmask, the deviation of the Gaussian noise it adds (differential privacy) and
    the scale of the +1/2 or -1/2 it adds after its change, by whether the change was within the clip
    before clipping (adaptive clipping; 0: none).
    """

    threshold: int
    devices: int
    clip: float
    weight: float
    unmask_s: float
    noise: float = 0.0
    count_scale: float = 0.0


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
    # set: the update goes into the round's secure sum, masked, in place of an upload
    secure_sum: SecureSum | None = None


@dataclass(frozen=True)
class EvaluationReport:
    """What a device sends back for an evaluation: counts only, never audio or file names.

    confusion[i][j] counts its test clips of true class i predicted as j; loss_sum is the summed
    cross-entropy over them. decisions counts the clips predicted as a word by the model's confidence
    in them, in DECISION_BINS steps: right ones, then wrong ones (what calibrates a detection threshold;
    None from a device that does not count them).
    """

    task_id: str
    round: int
    confusion: list[list[int]]
    loss_sum: float
    decisions: list[list[int]] | None = None


@dataclass(frozen=True)
class TaskFailure:
    """HTTP body a device posts when it could not do a task (which, the URL says): why, in one short line
    (at most message_checks.MAX_FAILURE_CHARS characters).
    """

    reason: str


@dataclass(frozen=True)
class ModelAnnouncement:
    """Retained announcement of a new global model."""

    round: int
    spec: ModelSpec
    labels: list[str]
    weights: BlobRef
    onnx: BlobRef | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    # when the coordinator made the model (Unix time); the round is the announcements' sequence
    issued_at: float = 0.0
    # the same model as two graphs, both or neither: its log-mel front-end and its classifier (see
    # protocol.onnx_metadata), so that a listener computes the features of new frames only
    frontend: BlobRef | None = None
    classifier: BlobRef | None = None


@dataclass(frozen=True)
class TaskWithdrawal:
    """Signed on a device's task topic, retained in place of the task: the coordinator no longer wants these
    tasks (their round closed). An unsigned or empty message on the topic withdraws nothing.
    """

    task_ids: list[str]


M = TypeVar("M")
N = TypeVar("N")

_KINDS: dict[type, str] = {
    Registration: "registration",
    Credentials: "credentials",
    DeviceStatus: "status",
    Task: "task",
    ModelAnnouncement: "model",
    TaskInfo: "task_info",
    EvaluationReport: "evaluation",
    TaskWithdrawal: "withdrawal",
    TaskFailure: "task_failure",
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
    body = _parse(payload)
    if body.get("kind") != _KINDS[kind]:
        raise ProtocolError(f"kind {body.get('kind')!r}, expected {_KINDS[kind]!r}")
    return _build(body, kind)


def decode_either(payload: bytes | bytearray | str, first: type[M], second: type[N]) -> M | N:
    """Parse and validate a message of either kind, whichever it names; ProtocolError with the reason."""
    body = _parse(payload)
    if body.get("kind") == _KINDS[second]:
        return _build(body, second)
    if body.get("kind") != _KINDS[first]:
        raise ProtocolError(f"kind {body.get('kind')!r}, expected {_KINDS[first]!r} or {_KINDS[second]!r}")
    return _build(body, first)


def _parse(payload: bytes | bytearray | str) -> dict[str, Any]:
    """The JSON object of a message of this schema version; ProtocolError if it is not one."""
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
    return body


def _build(body: dict[str, Any], kind: type[M]) -> M:
    """The message of that kind a parsed body holds, its values checked; ProtocolError if it holds none."""
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
        message_checks.check_spec(spec)
    if profile is not None:
        message_checks.check_profile(profile)
    if isinstance(message, Task):
        message_checks.check_task(message)
    definition = getattr(message, "definition", None)
    if definition is not None:
        message_checks.check_definition(definition)
    if isinstance(message, Credentials):
        for name in ("token", "broker_password", "listen_password"):
            value = getattr(message, name)
            if value is not None and not TOKEN.match(value):
                raise ProtocolError(f"bad {name.replace('_', ' ')}")
    if isinstance(message, ModelAnnouncement):
        message_checks.check_announcement(message)
    if isinstance(message, DeviceStatus):
        for counts in (message.train_counts, message.test_counts):
            message_checks.check_counts(counts)
    if isinstance(message, Registration):
        message_checks.check_counts(message.test_counts)
        if message.identity_key is not None and not message_checks.is_public_key(message.identity_key):
            raise ProtocolError("identity_key is not an Ed25519 public key in base64")
    if isinstance(message, EvaluationReport):
        message_checks.check_confusion(message)
    if isinstance(message, TaskWithdrawal):
        message_checks.check_withdrawal(message)
    if isinstance(message, TaskFailure):
        message_checks.check_failure(message)
