"""Versioned JSON messages of the control plane and the HTTP API, with validation."""

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

import dacite

SCHEMA_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024
DEVICE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


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
    """HTTP reply to a registration: the bearer token the device sends with its uploads."""

    device_id: str
    token: str


@dataclass(frozen=True)
class DeviceStatus:
    """Retained status of a device; 'offline' is also its last will."""

    device_id: str
    state: Literal["online", "training", "offline"]
    num_samples: int = 0
    profile: Profile | None = None
    round: int | None = None


@dataclass(frozen=True)
class Task:
    """Work for one device in one round: the model to start from and how to train it."""

    task_id: str
    round: int
    spec: ModelSpec
    weights: BlobRef
    upload_path: str
    epochs: int
    batch_size: int
    learning_rate: float
    deadline: float
    seed: int = 0
    proximal_mu: float = 0.0  # FedProx: > 0 keeps local training near the global model


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
}


def _float_hook(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"expected a number, got {value!r}")
    return float(value)


_CONFIG = dacite.Config(strict=False, type_hooks={float: _float_hook}, cast=[])


def encode(message: Any) -> bytes:
    """Serialise a message to JSON bytes with its kind and schema version."""
    body = {"v": SCHEMA_VERSION, "kind": _KINDS[type(message)], **asdict(message)}
    return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()


def _reject_constant(name: str) -> float:
    raise ProtocolError(f"non-finite number {name}")


def decode(payload: bytes | str, kind: type[M]) -> M:
    """Parse and validate a message of the given kind; raise ProtocolError with the reason."""
    if len(payload) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(payload)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        body = json.loads(payload, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
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
    except dacite.DaciteError as exc:
        raise ProtocolError(str(exc)) from None
    _check_values(message)
    return message


def _check_values(message: Any) -> None:
    """Range checks that types alone do not express."""
    device_id = getattr(message, "device_id", None)
    if device_id is not None and not DEVICE_ID.match(device_id):
        raise ProtocolError(f"bad device id {device_id!r}")
    for name in ("num_samples", "epochs", "batch_size", "round"):
        value = getattr(message, name, None)
        if value is not None and value < 0:
            raise ProtocolError(f"{name} must not be negative")
    if isinstance(message, Task) and (message.epochs < 1 or message.batch_size < 1):
        raise ProtocolError("epochs and batch_size must be at least 1")
    if isinstance(message, Task) and not (math.isfinite(message.learning_rate) and message.learning_rate > 0):
        raise ProtocolError("learning_rate must be positive")
    if isinstance(message, Task) and not (math.isfinite(message.proximal_mu) and message.proximal_mu >= 0):
        raise ProtocolError("proximal_mu must not be negative")
