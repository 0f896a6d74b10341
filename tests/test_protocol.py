"""The wire contract: messages round-trip, malformed input is rejected with a reason."""

import json

import numpy as np
import pytest

from fedspeech.protocol import messages, weights
from fedspeech.protocol.messages import (
    BlobRef,
    DeviceStatus,
    ModelAnnouncement,
    ModelSpec,
    Profile,
    ProtocolError,
    Registration,
    Task,
)
from fedspeech.protocol.topics import Topics, parse_broker_url

SPEC = ModelSpec("cnn", 8000, 8000, 10)
TASK = Task(
    "t1",
    3,
    SPEC,
    BlobRef("/api/models/2/weights", "ab" * 32, 1234),
    "/api/rounds/3/updates",
    2,
    32,
    1e-3,
    1e9,
)


@pytest.mark.parametrize(
    "message",
    [
        TASK,
        DeviceStatus("dev-1", "online", 450, Profile(4, 1800.0, 900.5)),
        DeviceStatus("dev-1", "offline"),
        Registration("dev-1", 450, Profile(4, 0.0, 100.0, 3.5, 0.002, 12.5)),
        ModelAnnouncement(4, SPEC, ["zero", "one"], TASK.weights, None, {"accuracy": 0.9}),
    ],
)
def test_messages_round_trip(message):
    assert messages.decode(messages.encode(message), type(message)) == message


def _task_with(**changes) -> bytes:
    body = json.loads(messages.encode(TASK))
    body.update(changes)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff\xfe", "not JSON"),
        (_task_with(v=2), "schema version"),
        (_task_with(kind="status"), "kind"),
        (_task_with(epochs="two"), "epochs"),
        (_task_with(epochs=0), "at least 1"),
        (_task_with(round=-1), "negative"),
        (_task_with(learning_rate=-0.1), "learning_rate"),
        (_task_with(spec={"name": "cnn"}), "sample_rate"),
        (messages.encode(TASK).replace(b'"learning_rate":0.001', b'"learning_rate":NaN'), "non-finite"),
        (b"{" + b" " * 70000 + b"}", "exceeds"),
        (b"[" * 60000, "nested too deeply"),
    ],
)
def test_malformed_task_is_rejected_with_reason(payload, reason):
    with pytest.raises(ProtocolError, match=reason):
        messages.decode(payload, Task)


def test_status_rejects_unknown_state_and_bad_device_id():
    with pytest.raises(ProtocolError, match="state"):
        messages.decode(
            messages.encode(DeviceStatus("d", "online")).replace(b"online", b"dancing"), DeviceStatus
        )
    with pytest.raises(ProtocolError, match="device id"):
        messages.decode(messages.encode(DeviceStatus("a/b#", "online")), DeviceStatus)


def test_topics_name_devices():
    topics = Topics("fleet/x")
    assert topics.device_of(topics.status("dev-1")) == "dev-1"
    assert topics.device_of(topics.task("dev-2")) == "dev-2"
    assert topics.device_of("fleet/x/model") is None
    assert topics.device_of("other/devices/a/status") is None


def test_weights_round_trip_with_metadata_and_digest():
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}
    blob = weights.encode(arrays, {"num_samples": "12"})
    decoded, meta = weights.decode(blob)
    assert meta == {"num_samples": "12"}
    assert all(np.array_equal(decoded[k], arrays[k]) for k in arrays)
    weights.check_digest(blob, weights.sha256(blob))
    with pytest.raises(weights.WeightsError, match="sha256"):
        weights.check_digest(blob + b"x", weights.sha256(blob))


@pytest.mark.parametrize("blob", [b"", b"\x05\x00\x00\x00\x00\x00\x00\x00abcde", b"x" * 100])
def test_corrupt_weights_are_rejected(blob):
    with pytest.raises(weights.WeightsError, match="safetensors"):
        weights.decode(blob)


def test_check_like_rejects_names_shapes_dtypes_and_non_finite():
    ref = {"w": np.zeros((2, 3), np.float32)}
    weights.check_like({"w": np.ones((2, 3), np.float32)}, ref)
    cases = [
        ({"v": np.zeros((2, 3), np.float32)}, "names"),
        ({"w": np.zeros((3, 2), np.float32)}, "shape"),
        ({"w": np.zeros((2, 3), np.float64)}, "dtype"),
        ({"w": np.array([[0, np.nan, 0], [0, 0, 0]], np.float32)}, "NaN"),
        ({"w": np.array([[0, np.inf, 0], [0, 0, 0]], np.float32)}, "infinite"),
    ]
    for arrays, reason in cases:
        with pytest.raises(weights.WeightsError, match=reason):
            weights.check_like(arrays, ref)


def test_parse_broker_url() -> None:
    assert parse_broker_url("mqtt://broker.local:1884") == ("broker.local", 1884)
    assert parse_broker_url("mqtt://127.0.0.1") == ("127.0.0.1", 1883)
    with pytest.raises(ValueError):
        parse_broker_url("http://127.0.0.1:1883")
