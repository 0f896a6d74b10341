"""Fuzzing the protocol's validators: whatever arrives, only the validator's own error escapes.

Every validator of input from the network or the operator sees EXAMPLES generated cases of each kind of
input: raw bytes or text, arbitrary JSON, mutations of a valid input (which get past the type checks to
the deep ones) and inputs built to a grammar (URLs, topics, TOML). What a validator accepts must keep the
bounds its module documents. Hypothesis spends milliseconds on each example, so each drawn case goes to
every validator it suits: the same bytes to each message kind, the weights and the signature check; the
same mutation to each valid message. The runs are derandomised and keep no example database, so CI sees
the same cases every time; FEDSPEECH_FUZZ_EXAMPLES sets the number of examples of each test.
"""

import base64
import json
import math
import os
import re
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedspeech.models.clips.tasks import TaskFileError, load_task
from fedspeech.protocol import bounds, message_checks, messages, routes, signing, weights
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import (
    BlobRef,
    Credentials,
    DeviceStatus,
    EvaluationReport,
    ModelAnnouncement,
    ModelSpec,
    Profile,
    Registration,
    Task,
    TaskDefinition,
    TaskFailure,
    TaskInfo,
)
from fedspeech.protocol.topics import Topics, parse_broker_url

# 3,500 examples of each test give every validator more than 10,000 cases (the fewest: parse_public_key,
# parse_broker_url and load_task, three per example) in about 3 minutes on two cores
EXAMPLES = int(os.environ.get("FEDSPEECH_FUZZ_EXAMPLES", "3500"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextmanager
def noted(note: str) -> Iterator[None]:
    """Add note to any exception raised inside, so that a failure says which validator and input."""
    try:
        yield
    except Exception as exc:
        exc.add_note(note)
        raise


# --- valid inputs: the seeds of the mutations --------------------------------------------------------

KINDS = [
    Registration,
    Credentials,
    DeviceStatus,
    Task,
    ModelAnnouncement,
    TaskInfo,
    EvaluationReport,
    TaskFailure,
]
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))  # fixed, so that runs repeat
OTHER_KEY = Ed25519PrivateKey.from_private_bytes(bytes(32))
SPEC = ModelSpec("cnn", 8000, 8000, 10)
DIGITS = TaskDefinition("digits", [str(d) for d in range(10)], 8000, 1.0)
PROFILE = Profile(4, 1800.0, 900.5, 3.5, 0.002, 12.5)
TASK = Task(
    "t1",
    3,
    SPEC,
    DIGITS,
    BlobRef("/api/models/2/weights", "ab" * 32, 1234),
    "/api/rounds/3/updates",
    2,
    32,
    1e-3,
    1.7e9,
    7,
    {"proximal_mu": 0.01},
)
VALID = {
    "registration": Registration("dev-1", 450, PROFILE),
    "credentials": Credentials("dev-1", "A1b2_C3d4-E5f6G7h8", signing.public_key_text(KEY)),
    "status": DeviceStatus("dev-1", "evaluating", 40, PROFILE, 3, {"yes": 30, "_unknown_": 10}, {"yes": 8}),
    "task": TASK,
    "relayed_task": replace(
        TASK,
        weights=BlobRef("/api/rounds/3/relays/2", "cd" * 32, 999),
        teacher=BlobRef("/api/models/2/teacher", "ef" * 32, 1234),
        config={"class_prior": [0.25, 0.75], "prior_weight": 1.0, "distill_weight": 0.5},
    ),
    "evaluation_task": Task(
        "e3",
        3,
        ModelSpec("transformer", 16000, 16000, 2, 4),
        TaskDefinition("yes_no", ["yes", "no"], 16000, 1.0),
        BlobRef("/api/models/3/weights", "0f" * 32, 1),
        "/api/rounds/3/evaluations",
        1,
        1,
        10.0,
        0.0,
        action="evaluate",
    ),
    "model": ModelAnnouncement(
        3,
        SPEC,
        ["zero", "one"],
        BlobRef("/api/models/3/weights", "ab" * 32, 1234),
        BlobRef("/api/models/3/onnx", "cd" * 32, bounds.MAX_BLOB_BYTES),
        {"accuracy": 0.9, "loss": 0.25},
    ),
    "task_info": TaskInfo(DIGITS, SPEC),
    "evaluation": EvaluationReport("t1", 3, [[5, 1], [0, 4]], 2.75),
    "task_failure": TaskFailure("no data folder /srv/clips"),
}
SEEDS = {name: json.loads(messages.encode(message)) for name, message in VALID.items()}
KIND_NAMES = {type(message): SEEDS[name]["kind"] for name, message in VALID.items()}
FIELD_NAMES = sorted(
    {"v", "kind"}
    | {f.name for kind in [*KINDS, BlobRef, ModelSpec, TaskDefinition, Profile] for f in fields(kind)}
)

TOPIC = Topics().task("dev-1")
BODY = messages.encode(TASK)
SIGNED = signing.sign(KEY, TOPIC, BODY)
ENVELOPE = json.loads(SIGNED)
SIGNATURE = base64.b64decode(ENVELOPE["signature"])
KEY_TEXT = signing.public_key_text(KEY)

BLOB = weights.encode(
    {
        "conv.weight": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        "steps": np.array([1, 2], dtype=np.int64),
        "scale": np.array(0.5, dtype=np.float64),
        "mask": np.zeros((0, 3), dtype=np.uint8),
        "half": np.ones(3, dtype=np.float16),
    },
    {"task_id": "t1", "num_samples": "12"},
)
HEADER_LENGTH = int.from_bytes(BLOB[:8], "little")
HEADER = json.loads(BLOB[8 : 8 + HEADER_LENGTH])
# safetensors' dtypes: some have no numpy counterpart
DTYPES = [
    "BOOL",
    "U8",
    "I8",
    "U16",
    "I16",
    "F16",
    "BF16",
    "U32",
    "I32",
    "F32",
    "U64",
    "I64",
    "F64",
    "F8_E4M3",
]

PATH_KINDS = ["weights", "onnx", "teacher", "updates", "evaluations", "relays"]
VALID_PATHS = [
    routes.model(7, "weights"),
    routes.model(0, "onnx"),
    routes.model(2, "teacher"),
    routes.updates(12),
    routes.evaluations(3),
    routes.relay(4, 1),
]
BASES = ["http://127.0.0.1:8080", "https://coordinator.example/", "http://[::1]:80/base", "http://h"]
BROKER = "mqtts://broker.example:8883"
TASK_FILE = ['name = "digits"', 'labels = ["zero", "one", "two"]', "sample_rate = 8000", "clip_seconds = 1.0"]


def with_header(header: bytes, length: int | None = None) -> bytes:
    """BLOB with another header, its length field right unless given."""
    return (
        (len(header) if length is None else length).to_bytes(8, "little") + header + BLOB[8 + HEADER_LENGTH :]
    )


def envelope_with(**changes: Any) -> bytes:
    """SIGNED with some of its envelope's fields changed."""
    return to_json({**ENVELOPE, **changes})


def b64(data: bytes) -> str:
    """Base64 text of bytes."""
    return base64.b64encode(data).decode()


# --- JSON values, including literals json.dumps cannot write ------------------------------------------

_RAW = re.compile(r'"\\u0000raw:([^"\\]*)\\u0000"')


def raw(literal: str) -> str:
    """A JSON literal json.dumps cannot write (1e400, an integer of 5000 digits), spliced in by to_json."""
    return f"\0raw:{literal}\0"


def to_json(value: Any) -> bytes:
    """JSON text of a value, NaN and infinities written as Python does, raw() literals spliced in."""
    return _RAW.sub(lambda match: match[1], json.dumps(value)).encode()


# depths around the recursion limit (1000), fixed so that shrinking never lands on the stack's exact limit
NESTINGS = st.sampled_from([1, 2, 10, 100, 500, 900, 1000, 1100, 5000]).map(lambda n: "[" * n + "]" * n)
RAW_LITERALS = st.one_of(
    st.sampled_from(["1e400", "-1e400", "1e-400", "-0", "-0.0", "9" * 4301, "-" + "1" * 5000, "1" * 4300]),
    NESTINGS,
).map(raw)
BOUNDARY_INTS = st.sampled_from(
    [0, -1, 1, 2, 63, 64, 65, 100, 101, 1024, 1025, 3999, 4000, 4096, 4097, 48000, 48001, 480000, 480001]
    + [10**9, 10**9 + 1, bounds.MAX_BLOB_BYTES, bounds.MAX_BLOB_BYTES + 1, 2**53, 2**53 + 1, -(2**53) - 1]
    + [2**63, 10**400, -(10**400)]
)
EXTREME_FLOATS = st.sampled_from([0.0, -0.0, -1e-300, 5e-324, 1e9, 1e9 + 1, 1e308, math.inf, math.nan])
NUMBERS = st.integers(-3, 3) | BOUNDARY_INTS | EXTREME_FLOATS | RAW_LITERALS
# every code point, lone surrogates too (st.text is fast on it); ANY_CHAR favours the troublesome ones
CHARS = st.characters(exclude_categories=())
ANY_CHAR = CHARS | st.sampled_from("\n\r\t\0 /.%?#@\\:٣")
KEYS = st.sampled_from(FIELD_NAMES) | st.text(CHARS, max_size=8)
LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | NUMBERS | st.text(CHARS, max_size=12)
# two levels deep at most, for speed (st.recursive costs several times more); NESTINGS go deeper
FLAT = LEAVES | st.lists(LEAVES, max_size=4) | st.dictionaries(KEYS, LEAVES, max_size=4)
JSON_VALUES = LEAVES | st.lists(FLAT, max_size=3) | st.dictionaries(KEYS, FLAT, max_size=4)

# --- mutations of a string, a JSON document, bytes ---------------------------------------------------

STEPS = st.tuples(
    st.sampled_from(["insert", "replace", "delete", "renumber", "extend"]),
    st.integers(0, 80),
    ANY_CHAR,
    NUMBERS,
)


def nudged(old: Any, step: tuple[str, int, str, Any]) -> Any:
    """A value a small step from old, which gets past the type checks to the range checks.

    A string gets char inserted at position, replacing one there, or added at its end (a trailing
    newline...), one character deleted, or its first number renumbered; a number goes one up or down,
    changes sign, or becomes number; anything else becomes number.
    """
    how, position, char, number = step
    if isinstance(old, str):
        position %= len(old) + 1
        edits = {
            "insert": old[:position] + char + old[position:],
            "replace": old[:position] + char + old[position + 1 :],
            "delete": old[:position] + old[position + 1 :],
            "renumber": re.sub(r"\d+", str(number), old, count=1),
            "extend": old + char,
        }
        return edits[how]
    if isinstance(old, bool) or not isinstance(old, int | float):
        return number
    return {"insert": old + 1, "delete": old - 1, "extend": -old}.get(how, number)


def edited(text: str, steps: list[tuple[str, int, str, Any]]) -> str:
    """text after the steps, in turn."""
    for step in steps:
        text = nudged(text, step)
    return text


@dataclass(frozen=True)
class Mutation:
    """A change to a JSON document, drawn once and applied to every seed.

    place picks a value nested in the document, modulo their number, so any place fits any document.
    how is "replace" (by value), "nudge" (by a step, see nudged), "drop" (the value and its key) or
    "add" (value, under key in an object; in a list, at position place).
    """

    how: str
    place: int
    value: Any = None
    key: str = ""
    step: tuple[str, int, str, Any] = ("insert", 0, "", 0)


PLACES = st.integers(0, 200)
MUTATIONS = st.lists(
    st.one_of(
        st.builds(Mutation, st.just("nudge"), PLACES, step=STEPS),
        st.builds(Mutation, st.just("replace"), PLACES, FLAT),
        st.builds(Mutation, st.just("drop"), PLACES),
        st.builds(Mutation, st.just("add"), PLACES, FLAT, KEYS),
    ),
    min_size=1,
    max_size=3,
)


def _children(value: Any) -> list[tuple[Any, Any]]:
    if isinstance(value, dict):
        return list(value.items())
    return list(enumerate(value)) if isinstance(value, list) else []


def _places(value: Any, prefix: tuple = ()) -> list[tuple]:
    """The path of every value nested in a JSON value."""
    found = []
    for key, child in _children(value):
        found += [(*prefix, key), *_places(child, (*prefix, key))]
    return found


def _get(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value))  # several times faster than copy.deepcopy


def mutate(document: Any, mutations: list[Mutation]) -> Any:
    """A copy of a JSON document with the mutations applied in turn."""
    document = _copy(document)
    for mutation in mutations:
        places = _places(document)
        value = _copy(mutation.value)  # shared by every seed, so never inserted itself
        if mutation.how == "add":
            containers = [()] + [p for p in places if isinstance(_get(document, p), dict | list)]
            target = _get(document, containers[mutation.place % len(containers)])
            if isinstance(target, dict):
                target[mutation.key] = value
            else:
                target.insert(mutation.place % (len(target) + 1), value)
        elif places:
            path = places[mutation.place % len(places)]
            parent = _get(document, path[:-1])
            if mutation.how == "drop":
                del parent[path[-1]]
            else:
                parent[path[-1]] = (
                    value if mutation.how == "replace" else nudged(parent[path[-1]], mutation.step)
                )
    return document


@dataclass(frozen=True)
class ByteEdit:
    """A change to bytes, drawn once and applied to every seed blob (position modulo its length).

    how is "flip" (xor with data's first byte), "insert" (data), "delete" (len(data) bytes) or "cut".
    """

    how: str
    position: int
    data: bytes


BYTE_EDITS = st.lists(
    st.builds(
        ByteEdit,
        st.sampled_from(["flip", "flip", "insert", "delete", "cut"]),
        st.integers(0, 2**16),
        st.binary(min_size=1, max_size=16),
    ),
    min_size=1,
    max_size=4,
)


def byte_edited(blob: bytes, edits: list[ByteEdit]) -> bytes:
    """blob after the edits, in turn."""
    for edit in edits:
        at = edit.position % (len(blob) + 1)
        if edit.how == "flip" and at < len(blob):
            blob = blob[:at] + bytes([blob[at] ^ edit.data[0]]) + blob[at + 1 :]
        elif edit.how == "insert":
            blob = blob[:at] + edit.data + blob[at:]
        elif edit.how == "delete":
            blob = blob[:at] + blob[at + len(edit.data) :]
        elif edit.how == "cut":
            blob = blob[:at]
    return blob


# --- the bounds an accepted message keeps ------------------------------------------------------------


def _is_name(text: str) -> bool:
    return bounds.NAME.fullmatch(text) is not None


def _is_number(value: Any, low: float, high: float) -> bool:
    return type(value) is float and math.isfinite(value) and low <= value <= high


def _blob_round(ref: BlobRef, kind: str) -> int:
    """The round of a blob reference of exactly routes.model's form, with a sha256 and a size in bounds."""
    assert bounds.SHA256.fullmatch(ref.sha256)
    assert 0 < ref.size <= bounds.MAX_BLOB_BYTES
    match = re.fullmatch(r"/api/models/(0|[1-9][0-9]{0,8})/(weights|onnx|teacher)", ref.path, re.ASCII)
    assert match is not None and match[2] == kind and ref.path == routes.model(int(match[1]), kind)
    return int(match[1])


def _assert_settings(values: Mapping[str, float | list[float]]) -> None:
    assert len(values) <= bounds.MAX_CONFIG
    for name, value in values.items():
        numbers = value if isinstance(value, list) else [value]
        assert _is_name(name) and len(numbers) <= bounds.MAX_LABELS
        assert all(_is_number(v, -math.inf, math.inf) for v in numbers)


def assert_definition(definition: TaskDefinition) -> None:
    """A task definition within check_definition's documented bounds."""
    assert _is_name(definition.name)
    labels = definition.labels
    assert 2 <= len(labels) <= bounds.MAX_LABELS and len(set(labels)) == len(labels)
    assert all(_is_name(label) for label in labels)
    assert bounds.SAMPLE_RATES[0] <= definition.sample_rate <= bounds.SAMPLE_RATES[1]
    assert _is_number(definition.clip_seconds, bounds.MIN_CLIP_SECONDS, bounds.MAX_CLIP_SECONDS)


def _assert_spec(spec: ModelSpec) -> None:
    assert _is_name(spec.name)
    assert bounds.SAMPLE_RATES[0] <= spec.sample_rate <= bounds.SAMPLE_RATES[1]
    assert 2 <= spec.num_classes <= bounds.MAX_LABELS
    assert 1 <= spec.num_samples <= bounds.SAMPLE_RATES[1] * bounds.MAX_CLIP_SECONDS
    assert spec.depth is None or 1 <= spec.depth <= bounds.MAX_DEPTH


def _assert_profile(profile: Profile) -> None:
    assert 1 <= profile.cpu_count <= 4096
    values = [profile.cpu_freq_mhz, profile.ram_available_mb, profile.cpu_gflops, profile.seconds_per_sample]
    assert all(v is None or _is_number(v, 0, 1e9) for v in [*values, profile.rtt_ms])


def _assert_task(task: Task) -> None:
    assert 1 <= task.epochs <= bounds.MAX_EPOCHS and 1 <= task.batch_size <= bounds.MAX_BATCH_SIZE
    assert _is_number(task.learning_rate, 0, bounds.MAX_LEARNING_RATE) and task.learning_rate > 0
    assert _is_number(task.deadline, -math.inf, math.inf)
    relayed = re.fullmatch(r"/api/rounds/(0|[1-9][0-9]{0,8})/relays/(0|[1-9][0-9]{0,8})", task.weights.path)
    if relayed is not None:  # an update relayed inside the task's own round
        assert int(relayed[1]) == task.round and bounds.SHA256.fullmatch(task.weights.sha256)
        assert 0 < task.weights.size <= bounds.MAX_BLOB_BYTES
    else:
        assert _blob_round(task.weights, "weights") <= task.round
    assert task.teacher is None or _blob_round(task.teacher, "teacher") <= task.round
    assert task.action in ("train", "evaluate")
    upload = routes.updates(task.round) if task.action == "train" else routes.evaluations(task.round)
    assert task.upload_path == upload
    _assert_settings(task.config)


def _assert_counts(counts: dict[str, int]) -> None:
    assert len(counts) <= bounds.MAX_LABELS
    assert all(_is_name(label) and 0 <= n <= bounds.MAX_COUNT for label, n in counts.items())


def assert_in_bounds(message: Any) -> None:
    """What decode accepted keeps the bounds of protocol.bounds, and survives a round trip."""
    if hasattr(message, "device_id"):
        assert bounds.DEVICE_ID.fullmatch(message.device_id)
    for name in ("num_samples", "round"):
        value = getattr(message, name, None)
        assert value is None or 0 <= value <= bounds.MAX_COUNT
    if hasattr(message, "task_id"):
        assert bounds.TASK_ID.fullmatch(message.task_id)
    if getattr(message, "spec", None) is not None:
        _assert_spec(message.spec)
    if getattr(message, "profile", None) is not None:
        _assert_profile(message.profile)
    if hasattr(message, "definition"):
        assert_definition(message.definition)
    if isinstance(message, Task):
        _assert_task(message)
    if isinstance(message, Credentials):
        assert bounds.TOKEN.fullmatch(message.token)
    if isinstance(message, DeviceStatus):
        assert message.state in ("online", "training", "evaluating", "offline")
        _assert_counts(message.train_counts)
        _assert_counts(message.test_counts)
    if isinstance(message, ModelAnnouncement):
        assert _blob_round(message.weights, "weights") == message.round
        assert message.onnx is None or _blob_round(message.onnx, "onnx") == message.round
        assert 2 <= len(message.labels) <= bounds.MAX_LABELS and all(map(_is_name, message.labels))
        _assert_settings(message.metrics)
    if isinstance(message, EvaluationReport):
        size = len(message.confusion)
        assert 2 <= size <= bounds.MAX_LABELS and all(len(row) == size for row in message.confusion)
        assert all(0 <= n <= bounds.MAX_COUNT for row in message.confusion for n in row)
        assert _is_number(message.loss_sum, 0, math.inf)
    if isinstance(message, TaskFailure):
        assert 1 <= len(message.reason) <= message_checks.MAX_FAILURE_CHARS
    assert messages.decode(messages.encode(message), type(message)) == message


# --- each validator's contract -----------------------------------------------------------------------


def decode_checked(payload: bytes | str, kind: type) -> None:
    """messages.decode: a message of the kind within its bounds, or ProtocolError."""
    with noted(f"messages.decode as {kind.__name__}: {payload[:3000]!r}"):
        try:
            message: Any = messages.decode(payload, kind)
        except ProtocolError:
            return
        assert type(message) is kind
        assert_in_bounds(message)


def verify_checked(topic: str, payload: bytes) -> None:
    """signing.verify: ProtocolError, or the genuine body under its genuine signature and topic."""
    with noted(f"signing.verify on {topic!r}: {payload[:3000]!r}"):
        try:
            body = signing.verify(KEY.public_key(), topic, payload)
        except ProtocolError:
            return
        assert body == BODY and topic == TOPIC
        assert base64.b64decode(json.loads(payload)["signature"]) == SIGNATURE


def key_checked(text: str) -> None:
    """signing.parse_public_key: the key of base64 text of 32 bytes, or ProtocolError."""
    with noted(f"signing.parse_public_key: {text[:3000]!r}"):
        try:
            key = signing.parse_public_key(text)
        except ProtocolError:
            return
        raw_bytes = base64.b64decode(text.strip(), validate=True)
        assert len(raw_bytes) == 32 and signing.public_key_text(key) == b64(raw_bytes)


def weights_checked(blob: bytes) -> None:
    """weights.decode: named arrays and string metadata, or WeightsError."""
    with noted(f"weights.decode: {blob[:3000]!r}"):
        try:
            arrays, metadata = weights.decode(blob)
        except weights.WeightsError:
            return
        assert all(isinstance(name, str) and isinstance(array, np.ndarray) for name, array in arrays.items())
        assert isinstance(metadata, dict) and all(isinstance(v, str) for v in [*metadata, *metadata.values()])


def path_checked(path: str, kind: str) -> None:
    """routes.model_round, result_round and relay_round: a path's round, exactly their form, or ValueError."""
    with noted(f"routes.model_round / result_round / relay_round of {path[:3000]!r} as {kind!r}"):
        try:
            round_ = routes.model_round(path, kind)
            assert kind in routes.MODEL_KINDS and 0 <= round_ < 10**9 and path == routes.model(round_, kind)
        except ValueError:
            pass
        try:
            round_ = routes.relay_round(path)
            relayed = re.fullmatch(r"/api/rounds/([0-9]+)/relays/([0-9]+)", path)
            assert (
                relayed is not None and path == routes.relay(round_, int(relayed[2])) and 0 <= round_ < 10**9
            )
        except ValueError:
            pass
        try:
            round_ = routes.result_round(path, kind)
            assert kind in ("updates", "evaluations") and 0 <= round_ < 10**9
            assert path == (routes.updates(round_) if kind == "updates" else routes.evaluations(round_))
        except ValueError:
            pass


def _host_and_port(url: str) -> Any:
    """urlsplit's (host, port) of a URL, or the type of error reading them raises."""
    parts = urlsplit(url)
    try:
        return parts.hostname, parts.port
    except ValueError as exc:
        return type(exc)


def _request_host(url: str) -> str | None:
    """The host urllib.request, which devices download with, would connect to; None if none."""
    try:
        return urllib.request.Request(url).host or None
    except ValueError:
        return None


def url_checked(base: str, path: str) -> None:
    """routes.url: base and path joined on base's scheme, host and port, or ValueError."""
    with noted(f"routes.url({base[:1000]!r}, {path[:3000]!r})"):
        try:
            joined = routes.url(base, path)
        except ValueError:
            return
        base_parts, parts = urlsplit(base), urlsplit(joined)
        assert joined == base.rstrip("/") + path
        assert parts.scheme == base_parts.scheme and parts.scheme in ("http", "https")
        assert parts.netloc == base_parts.netloc and _host_and_port(joined) == _host_and_port(base)
        # the path must not move the host urllib connects to (which may differ from urlsplit's for an
        # odd base, one with a trailing newline say: that is the operator's to fix, not a message's)
        assert _request_host(joined) == _request_host(base.rstrip("/") + routes.PREFIX + "/")


def broker_checked(url: str) -> None:
    """topics.parse_broker_url: the URL's host and a port, or ValueError."""
    with noted(f"parse_broker_url: {url[:3000]!r}"):
        try:
            host, port = parse_broker_url(url)
        except ValueError:
            return
        parts = urlsplit(url)
        assert parts.scheme in ("mqtt", "mqtts") and host and host == parts.hostname
        assert type(port) is int and 0 < port <= 65535


def device_checked(root: str, topic: str) -> None:
    """Topics.device_of: None, or the one segment between the root's devices/ and the topic's last."""
    with noted(f"Topics({root[:1000]!r}).device_of({topic[:3000]!r})"):
        device = Topics(root).device_of(topic)
        if device is None:
            return
        assert isinstance(device, str) and device and "/" not in device
        rest = topic.removeprefix(f"{root}/devices/{device}/")
        assert rest != topic and "/" not in rest


def task_file_checked(path: Path, document: str | bytes) -> None:
    """models.clips.tasks.load_task on a file holding document: a definition in bounds, or TaskFileError."""
    if isinstance(document, bytes):
        path.write_bytes(document)
    else:
        path.write_text(document, errors="surrogatepass")
    with noted(f"load_task of a file holding {document[:3000]!r}"):
        try:
            definition = load_task(path)
        except TaskFileError:
            return
        finally:
            path.unlink()  # a new file each time: truncating one costs ext4 a flush
        assert_definition(definition)


def text_checked(text: str, task_file: Path) -> None:
    """Every validator that reads text, on text."""
    key_checked(text)
    for kind in PATH_KINDS:
        path_checked(text, kind)
    for base in BASES:
        url_checked(base, text)
    url_checked(text, VALID_PATHS[0])
    broker_checked(text)
    device_checked("fedspeech/v1", text)
    device_checked(text, Topics().status("dev-1"))
    task_file_checked(task_file, text)


@pytest.fixture(scope="module")
def task_file(tmp_path_factory) -> Path:
    """Where each case writes its task file."""
    return tmp_path_factory.mktemp("tasks") / "task.toml"


# --- the tests ---------------------------------------------------------------------------------------


def test_the_seeds_are_valid(task_file):
    for message in VALID.values():
        assert messages.decode(messages.encode(message), type(message)) == message
    assert signing.verify(KEY.public_key(), TOPIC, SIGNED) == BODY
    assert signing.parse_public_key(KEY_TEXT).public_bytes_raw() == KEY.public_key().public_bytes_raw()
    assert weights.decode(BLOB)[1] == {"task_id": "t1", "num_samples": "12"}
    assert [
        routes.model_round(VALID_PATHS[0], "weights"),
        routes.model_round(VALID_PATHS[2], "teacher"),
        routes.result_round(VALID_PATHS[3], "updates"),
        routes.relay_round(VALID_PATHS[5]),
    ] == [7, 2, 12, 4]
    assert routes.url(BASES[0], VALID_PATHS[0]) == "http://127.0.0.1:8080/api/models/7/weights"
    assert parse_broker_url(BROKER) == ("broker.example", 8883)
    assert Topics().device_of(TOPIC) == "dev-1"
    task_file.write_text("\n".join(TASK_FILE))
    assert load_task(task_file) == TaskDefinition("digits", ["zero", "one", "two"], 8000, 1.0)


def _padded(size: int) -> bytes:
    """A valid message with spaces after it, size bytes in all: around MAX_MESSAGE_BYTES."""
    payload = messages.encode(TASK)
    return payload + b" " * (size - len(payload))


@FUZZ
@given(
    payload=st.binary()
    | st.text(CHARS)
    | st.integers(messages.MAX_MESSAGE_BYTES - 2, messages.MAX_MESSAGE_BYTES + 2).map(_padded)
)
def test_any_bytes_or_text(task_file, payload):
    """Every validator: each message kind, a signed payload, weights, paths, URLs, topics, a task file."""
    data = payload.encode(errors="surrogatepass") if isinstance(payload, str) else payload
    text = payload if isinstance(payload, str) else payload.decode(errors="surrogateescape")
    for kind in KINDS:
        decode_checked(payload, kind)
        decode_checked(text if isinstance(payload, bytes) else data, kind)
    verify_checked(TOPIC, data)
    weights_checked(data)
    text_checked(text, task_file)


@FUZZ
@given(value=JSON_VALUES | st.dictionaries(st.sampled_from(FIELD_NAMES), FLAT, max_size=12))
def test_any_json(value):
    """Each message kind, also with the right version and kind; a signed envelope; a safetensors header."""
    payload = to_json(value)
    for kind in KINDS:
        decode_checked(payload, kind)
        if isinstance(value, dict):
            decode_checked(to_json({**value, "v": messages.SCHEMA_VERSION, "kind": KIND_NAMES[kind]}), kind)
    verify_checked(TOPIC, payload)
    if isinstance(value, dict):
        verify_checked(TOPIC, to_json({**value, "kind": "signed"}))
    weights_checked(with_header(payload))


def _with_dtype(header: dict, dtype: tuple[int, str] | None) -> dict:
    """header with one tensor's dtype changed, if dtype (index, name) is given."""
    tensors = sorted(k for k, v in header.items() if isinstance(v, dict) and k != "__metadata__")
    if dtype is not None and tensors:
        header[tensors[dtype[0] % len(tensors)]]["dtype"] = dtype[1]
    return header


@FUZZ
@given(
    mutations=MUTATIONS,
    dtype=st.none() | st.tuples(st.integers(0, 9), st.sampled_from(DTYPES)),
)
def test_mutated_documents(mutations, dtype):
    """The same mutations of each kind's valid message, of a signed envelope and of a safetensors header."""
    for name, seed in SEEDS.items():
        with noted(f"mutating the {name} message"):
            decode_checked(to_json(mutate(seed, mutations)), type(VALID[name]))
    verify_checked(TOPIC, to_json(mutate(ENVELOPE, mutations)))
    weights_checked(with_header(to_json(_with_dtype(mutate(HEADER, mutations), dtype))))
    weights_checked(with_header(to_json(_with_dtype(_copy(HEADER), dtype))))


@FUZZ
@given(steps=st.lists(STEPS, min_size=1, max_size=3))
def test_edited_strings(task_file, steps):
    """The same edits of each valid string: paths, URLs, topics, the key, a signature, a task file."""
    for path in [edited(path, steps) for path in VALID_PATHS]:
        for kind in PATH_KINDS:
            path_checked(path, kind)
        url_checked(BASES[0], path)
    for base in BASES:
        url_checked(edited(base, steps), VALID_PATHS[0])
    key_checked(edited(KEY_TEXT, steps))
    broker_checked(edited(BROKER, steps))
    device_checked("fedspeech/v1", edited(TOPIC, steps))
    device_checked(edited("fedspeech/v1", steps), TOPIC)
    verify_checked(edited(TOPIC, steps), SIGNED)  # the genuine payload on another topic
    verify_checked(TOPIC, envelope_with(body=edited(ENVELOPE["body"], steps)))
    verify_checked(TOPIC, envelope_with(signature=edited(ENVELOPE["signature"], steps)))
    task_file_checked(task_file, edited("\n".join(TASK_FILE), steps))


@FUZZ
@given(
    edits=BYTE_EDITS, length=st.integers(0, 2**64 - 1) | st.integers(-9, 9).map(lambda d: HEADER_LENGTH + d)
)
def test_edited_bytes(edits, length):
    """The same byte edits of a signed payload, its body and signature, a message, a blob, a public key."""
    verify_checked(TOPIC, byte_edited(SIGNED, edits))
    verify_checked(TOPIC, envelope_with(body=b64(byte_edited(BODY, edits))))
    verify_checked(TOPIC, envelope_with(signature=b64(byte_edited(SIGNATURE, edits))))
    verify_checked(TOPIC, signing.sign(OTHER_KEY, TOPIC, byte_edited(BODY, edits)))
    decode_checked(byte_edited(BODY, edits), Task)
    weights_checked(byte_edited(BLOB, edits))
    weights_checked(with_header(BLOB[8 : 8 + HEADER_LENGTH], length))
    key_checked(b64(byte_edited(KEY.public_key().public_bytes_raw(), edits)))


def _url(scheme: str, slashes: str, userinfo: str, host: str, port: str, tail: str) -> str:
    return f"{scheme}:{slashes}{userinfo}{host}{port}{tail}"


HOSTS = st.sampled_from(["127.0.0.1", "localhost", "[::1]", "coordinator.example", "[::1", "a b", ""])
URL_CHARS = st.characters(categories=(), include_characters="az09.:/@?#[]%\\ \t\n-_~")
URL_TEXT = st.text(URL_CHARS, max_size=8) | st.text(CHARS, max_size=8)
PORTS = st.sampled_from(["", ":0", ":65535", ":65536", ":-1", ":x", ":", ":١٢"]) | st.integers().map(
    lambda n: f":{n}"
)
USERINFO = st.sampled_from(["", "user@", "user:pw@", "@"]) | URL_TEXT.map(lambda s: s + "@")
TAILS = st.sampled_from(["", "/", "//", "/base/", "?q=1", "#top", "/.."]) | URL_TEXT
URLS = st.builds(
    _url,
    st.sampled_from(["http", "https", "HTTPS", "mqtt", "mqtts", "MQTT", "ftp", ""]) | URL_TEXT,
    st.sampled_from(["//", "/", "", "///"]),
    USERINFO,
    HOSTS | URL_TEXT,
    PORTS | URL_TEXT.map(lambda s: ":" + s),
    TAILS,
)
API_PATHS = st.one_of(
    st.builds(routes.model, st.integers(-5, 10**10) | BOUNDARY_INTS, st.sampled_from(["weights", "onnx"])),
    st.builds(routes.updates, st.integers(-5, 10**10) | BOUNDARY_INTS),
    st.builds(
        lambda before, path, after: before + path + after,
        st.text(CHARS, max_size=3),
        st.sampled_from(VALID_PATHS),
        st.text(CHARS, max_size=3),
    ),
)
ROOTS = st.sampled_from(["fedspeech/v1", "a", "", "x/devices"]) | st.text(CHARS, max_size=10)
SEGMENTS = st.lists(
    st.sampled_from(["dev-1", "status", "task", "", "+", "#", "devices"]) | st.text(CHARS, max_size=6),
    max_size=4,
)


@FUZZ
@given(url=URLS, path=API_PATHS, kind=st.sampled_from(PATH_KINDS), root=ROOTS, segments=SEGMENTS)
def test_addresses(url, path, kind, root, segments):
    """URLs built of schemes, hosts and ports; paths of the API's forms; topics of segments."""
    url_checked(url, path)
    url_checked(url, VALID_PATHS[1])
    path_checked(path, kind)
    broker_checked(url)
    device_checked(root, "/".join([root, "devices", *segments]))


TOML_KEYS = st.sampled_from(["name", "labels", "sample_rate", "clip_seconds"]) | st.one_of(
    st.text(
        st.characters(codec="ascii", categories=["L", "N"], include_characters="_-"), min_size=1, max_size=8
    ),
    st.text(CHARS, max_size=6).map(json.dumps),
)
TOML_SCALARS = st.one_of(
    st.text(CHARS, max_size=12).map(json.dumps),
    st.text(CHARS, max_size=12).map(lambda s: f"'{s}'"),
    st.integers().map(str),
    st.floats().map(repr),
    st.sampled_from(["1" * 5000, "9" * 4301, "1" + "0" * 400, "0x" + "f" * 5000, "1e400", "-1e400", "inf"]),
    st.sampled_from(["nan", "+nan", "true", "false", "1979-05-27T07:32:00Z", "0o777", "0b101", '"a\\n"']),
    st.sampled_from(['"digits"', '"zero"', "8000", "1.0", "0.1", "10.0", "4000", "48000"]),
)
TOML_LISTS = st.lists(TOML_SCALARS, max_size=4).map(lambda items: "[" + ", ".join(items) + "]")
TOML_TABLES = st.lists(st.tuples(TOML_KEYS, TOML_SCALARS | TOML_LISTS), max_size=3).map(
    lambda pairs: "{" + ", ".join(f"{k} = {v}" for k, v in pairs) + "}"
)
TOML_VALUES = TOML_SCALARS | TOML_LISTS | TOML_TABLES | NESTINGS
TOML_LINES = st.one_of(
    st.tuples(TOML_KEYS, TOML_VALUES).map(lambda pair: f"{pair[0]} = {pair[1]}"),
    TOML_KEYS.map(lambda key: f"[{key}]"),
    st.text(CHARS, max_size=30),
)


def _task_file_with(position: int, how: str, line: str) -> str:
    """TASK_FILE with one line replaced (line is then the value), inserted or deleted."""
    lines = list(TASK_FILE)
    position %= len(lines)
    if how == "replace":
        lines[position] = f"{lines[position].split(' = ')[0]} = {line}"
    elif how == "insert":
        lines.insert(position, line)
    else:
        del lines[position]
    return "\n".join(lines)


TASK_FILES = st.one_of(
    st.lists(TOML_LINES, max_size=6).map("\n".join),
    st.builds(_task_file_with, st.integers(0, 3), st.sampled_from(["insert", "delete"]), TOML_LINES),
    st.builds(_task_file_with, st.integers(0, 3), st.just("replace"), TOML_VALUES),
)


@FUZZ
@given(document=TASK_FILES)
def test_task_files(task_file, document):
    """TOML of the task file's keys, other keys, values of every TOML type, tables, lines of anything."""
    task_file_checked(task_file, document)


def test_decode_rejects_nesting_at_every_depth():
    """Nesting from shallow to past the recursion limit, at every place of every message."""
    for name, seed in SEEDS.items():
        for place in range(len(_places(seed))):
            for depth in [*range(1, 1200, 97), 990, 995, 1000, 5000]:
                nest = Mutation("replace", place, raw("[" * depth + "]" * depth))
                with noted(f"{name} with a value nested {depth} deep at place {place}"):
                    decode_checked(to_json(mutate(seed, [nest])), type(VALID[name]))


@pytest.mark.parametrize(
    "payload",
    [
        signing.sign(OTHER_KEY, TOPIC, BODY),
        signing.sign(KEY, Topics().task("dev-2"), BODY),
        signing.sign(KEY, TOPIC + "/", BODY),
        BODY,
    ],
    ids=["another key", "another device's topic", "another topic", "unsigned"],
)
def test_verify_rejects_what_the_key_did_not_sign_for_the_topic(payload):
    with pytest.raises(ProtocolError):
        signing.verify(KEY.public_key(), TOPIC, payload)


# --- what the fuzzing found, in its smallest form ----------------------------------------------------


def _seed_with(name: str, path: tuple, value: Any) -> bytes:
    document = _copy(SEEDS[name])
    _get(document, path[:-1])[path[-1]] = value
    return to_json(document)


def _safetensors(dtype: str) -> bytes:
    header = to_json({"x": {"dtype": dtype, "shape": [1], "data_offsets": [0, 2]}})
    return len(header).to_bytes(8, "little") + header + b"\0\0"


FOUND = [
    ("decode: integer of 4301 digits", lambda: messages.decode(b"1" * 4301, Task), ProtocolError),
    (
        "verify: integer of 4301 digits",
        lambda: signing.verify(KEY.public_key(), TOPIC, b"1" * 4301),
        ProtocolError,
    ),
    (
        "decode: an object where a list belongs",
        lambda: messages.decode(_seed_with("task_info", ("definition", "labels"), {"x": 0}), TaskInfo),
        ProtocolError,
    ),
    (
        "decode: an integer too large for a float",
        lambda: messages.decode(_seed_with("evaluation", ("loss_sum",), 10**400), EvaluationReport),
        ProtocolError,
    ),
    (
        "decode: device id with a trailing newline",
        lambda: messages.decode(_seed_with("registration", ("device_id",), "dev-1\n"), Registration),
        ProtocolError,
    ),
    (
        "decode: task name with a trailing newline",
        lambda: messages.decode(_seed_with("task_info", ("definition", "name"), "digits\n"), TaskInfo),
        ProtocolError,
    ),
    (
        "decode: label with a trailing newline",
        lambda: messages.decode(_seed_with("model", ("labels", 0), "zero\n"), ModelAnnouncement),
        ProtocolError,
    ),
    (
        "decode: task id with a trailing newline",
        lambda: messages.decode(_seed_with("evaluation", ("task_id",), "t1\n"), EvaluationReport),
        ProtocolError,
    ),
    (
        "decode: token with a trailing newline",
        lambda: messages.decode(_seed_with("credentials", ("token",), "A1b2_C3d4-E5f6G7h8\n"), Credentials),
        ProtocolError,
    ),
    (
        "decode: sha256 with a trailing newline",
        lambda: messages.decode(
            _seed_with("model", ("weights", "sha256"), "ab" * 32 + "\n"), ModelAnnouncement
        ),
        ProtocolError,
    ),
    (
        "verify: a topic with a lone surrogate, which UTF-8 cannot encode",
        lambda: signing.verify(KEY.public_key(), "\ud800" + TOPIC, SIGNED),
        ProtocolError,
    ),
    (
        "weights: a dtype numpy lacks (BF16)",
        lambda: weights.decode(_safetensors("BF16")),
        weights.WeightsError,
    ),
]


@pytest.mark.parametrize(
    ("call", "error"), [pytest.param(call, error, id=name) for name, call, error in FOUND]
)
def test_inputs_found_by_fuzzing(call, error):
    with pytest.raises(error):
        call()


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("x = " + "[" * 3000 + "]" * 3000, id="nesting of 3000 arrays"),
        pytest.param("x = " + "{a = " * 3000 + "}" * 3000, id="nesting of 3000 tables"),
        pytest.param(
            "\n".join([*TASK_FILE[:3], "clip_seconds = 1" + "0" * 400]), id="clip_seconds of 401 digits"
        ),
        pytest.param("\n".join([*TASK_FILE[:2], "sample_rate = " + "1" * 4301]), id="integer of 4301 digits"),
        pytest.param(
            "\n".join([*TASK_FILE[:2], "sample_rate = 0x" + "f" * 5000]), id="sample_rate of 5000 hex digits"
        ),
        pytest.param("\n".join(["name = 0x" + "f" * 5000, *TASK_FILE[1:]]), id="name of 5000 hex digits"),
        pytest.param(
            "\n".join([TASK_FILE[0], "labels = [0x" + "f" * 5000 + "]", *TASK_FILE[2:]]), id="hex label"
        ),
        pytest.param("\n".join(['name = "digits\\n"', *TASK_FILE[1:]]), id="name with a trailing newline"),
    ],
)
def test_task_files_found_by_fuzzing(tmp_path, text):
    (tmp_path / "task.toml").write_text(text)
    with pytest.raises(TaskFileError):
        load_task(tmp_path / "task.toml")
