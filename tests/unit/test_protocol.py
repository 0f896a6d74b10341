"""The wire contract: messages round-trip, malformed input is rejected with a reason."""

import json
from dataclasses import asdict, replace

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.protocol import message_checks, messages, routes, signing, weights
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import (
    BlobRef,
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
    TaskWithdrawal,
)
from fedspeech.protocol.topics import Topics, parse_broker_url

SPEC = ModelSpec("cnn", 8000, 8000, 10)
DIGITS = TaskDefinition("digits", [str(d) for d in range(10)], 8000, 1.0)
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
    1e9,
)


@pytest.mark.parametrize(
    "message",
    [
        TASK,
        DeviceStatus("dev-1", "online", 450, Profile(4, 1800.0, 900.5)),
        DeviceStatus("dev-1", "offline"),
        DeviceStatus("dev-1", "evaluating", 40, None, 3, {"yes": 30, "_unknown_": 10}, {"yes": 8}),
        TaskInfo(DIGITS, SPEC),
        EvaluationReport("t1", 3, [[5, 1], [0, 4]], 2.75),
        Registration("dev-1", 450, Profile(4, 0.0, 100.0, 3.5, 0.002, 12.5)),
        ModelAnnouncement(2, SPEC, ["zero", "one"], TASK.weights, None, {"accuracy": 0.9}, 1.7e9),
        TaskWithdrawal(["t1", "t2"]),
        TaskWithdrawal([]),
        TaskFailure("no data folder /srv/clips"),
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
        (_task_with(epochs=0), "epochs must be 1 to"),
        (_task_with(epochs=100_000), "epochs must be 1 to"),
        (_task_with(batch_size=10**6), "batch_size 1 to"),
        (_task_with(round=-1), "between 0"),
        (_task_with(task_id="../x"), "task id"),
        (_task_with(upload_path=":18081/api/rounds/3/updates"), "path of a round's updates"),
        (_task_with(upload_path="/api/rounds/4/updates"), "upload path of round 4"),
        (_task_with(upload_path="/api/rounds/3/evaluations"), "path of a round's updates"),
        (_task_with(upload_path="/api/rounds/03/updates"), "path of a round's updates"),
        (_task_with(weights={**asdict(TASK.weights), "path": "//evil.example/api/models/2/weights"}), "path"),
        (_task_with(weights={**asdict(TASK.weights), "path": "/api/models/4/weights"}), "earlier one"),
        (_task_with(weights={**asdict(TASK.weights), "size": 10**9}), "size 1 to"),
        (_task_with(weights={**asdict(TASK.weights), "sha256": "AB" * 32}), "64 hex"),
        (_task_with(learning_rate=-0.1), "learning_rate"),
        (
            _task_with(weights={**asdict(TASK.weights), "path": "/api/rounds/2/relays/1"}),
            "relayed in round 2",
        ),
        (_task_with(weights={**asdict(TASK.weights), "path": "/api/rounds/3/relays/x"}), "relayed update"),
        (_task_with(weights={**asdict(TASK.weights), "path": "/api/rounds/3/relays/01"}), "relayed update"),
        (_task_with(teacher={**asdict(TASK.weights), "path": "/api/models/4/teacher"}), "teacher must come"),
        (_task_with(teacher={**asdict(TASK.weights), "path": "/api/models/2/weights"}), "round's teacher"),
        (_task_with(spec={"name": "cnn"}), "sample_rate"),
        (_task_with(definition={**asdict(DIGITS), "labels": ["a"]}), "2 and"),
        (_task_with(definition={**asdict(DIGITS), "labels": ["../../etc", "b"]}), "folder name"),
        (_task_with(definition={**asdict(DIGITS), "sample_rate": 10**6}), "sample_rate"),
        (_task_with(action="delete"), "action"),
        (_task_with(precision="float64"), "precision"),
        (_task_with(precision="float16"), "path of a round's float16"),  # its weights are float32's
        (_task_with(config={"proximal_mu": "high"}), "can not match"),
        (_task_with(config={"class_prior": [0.5, "x"]}), "can not match"),
        (_task_with(config={"class_prior": [0.5] * 65}), "bad config setting"),
        (_task_with(config={"class_prior": [[0.5]]}), "can not match"),
        (_task_with(config={f"s{i}": 1.0 for i in range(17)}), "more than 16"),
        (_task_with(config={"../x": 1.0}), "bad config setting"),
        (_task_with(round=10**400), "out of range"),
        (messages.encode(TASK).replace(b'"learning_rate":0.001', b'"learning_rate":NaN'), "non-finite"),
        (b"{" + b" " * 70000 + b"}", "exceeds"),
        (b"[" * 60000, "nested too deeply"),
    ],
)
def test_malformed_task_is_rejected_with_reason(payload, reason):
    with pytest.raises(ProtocolError, match=reason):
        messages.decode(payload, Task)


def test_a_task_trains_from_an_update_relayed_in_its_round_with_a_teacher():
    relayed = replace(
        TASK,
        weights=replace(TASK.weights, path=routes.relay(3, 2)),
        teacher=replace(TASK.weights, path=routes.model(2, "teacher")),
        config={"class_prior": [0.25, 0.75], "prior_weight": 1.0},
    )
    assert messages.decode(messages.encode(relayed), Task) == relayed


def test_status_rejects_unknown_state_and_bad_device_id():
    with pytest.raises(ProtocolError, match="state"):
        messages.decode(
            messages.encode(DeviceStatus("d", "online")).replace(b"online", b"dancing"), DeviceStatus
        )
    with pytest.raises(ProtocolError, match="device id"):
        messages.decode(messages.encode(DeviceStatus("a/b#", "online")), DeviceStatus)


def _report_with(**changes) -> bytes:
    body = json.loads(messages.encode(EvaluationReport("t1", 3, [[5, 1], [0, 4]], 2.75)))
    body.update(changes)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (_report_with(confusion=[[1, 2, 3], [4, 5, 6]]), "square"),
        (_report_with(confusion=[[1]]), "square"),
        (_report_with(confusion=[[1, -1], [0, 0]]), "between 0"),
        (_report_with(confusion=[[1, 10**12], [0, 0]]), "between 0"),
        (_report_with(confusion=[[1, 2.5], [0, 0]]), "confusion"),
        (_report_with(confusion=[[0] * 65] * 65), "square"),
        (_report_with(loss_sum=-1.0), "loss_sum"),
    ],
)
def test_malformed_evaluation_report_is_rejected(payload, reason):
    with pytest.raises(ProtocolError, match=reason):
        messages.decode(payload, EvaluationReport)


@pytest.mark.parametrize(
    ("counts", "reason"),
    [
        ({"yes": -1}, "bad count"),
        ({"../etc": 1}, "bad count"),
        ({f"label{i}": 1 for i in range(65)}, "more than"),
    ],
)
def test_status_counts_are_bounded(counts, reason):
    body = json.loads(messages.encode(DeviceStatus("dev-1", "online")))
    body["train_counts"] = counts
    with pytest.raises(ProtocolError, match=reason):
        messages.decode(json.dumps(body), DeviceStatus)


def test_topics_name_devices():
    topics = Topics("fleet/x")
    assert topics.device_of(topics.status("dev-1")) == "dev-1"
    assert topics.device_of(topics.task("dev-2")) == "dev-2"
    assert topics.device_of("fleet/x/model") is None
    assert topics.device_of("other/devices/a/status") is None


def test_a_float16_task_downloads_the_rounds_float16_weights():
    half = replace(TASK, precision="float16", weights=replace(TASK.weights, path=routes.model(2, "float16")))
    assert messages.decode(messages.encode(half), Task) == half


def test_precision_casts_floating_arrays_only_and_float16_overflow_is_caught():
    arrays = {"w": np.array([1 / 3, 1e5], np.float32), "steps": np.array([7], np.int64)}
    with pytest.warns(RuntimeWarning, match="overflow"):
        half = weights.with_precision(arrays, "float16")
    assert half["w"].dtype == np.float16 and half["steps"].dtype == np.int64
    assert weights.with_precision(half, "float32")["w"][0] == np.float32(np.float16(1 / 3))
    with pytest.raises(weights.WeightsError, match="infinite"):  # 1e5 is past float16's 65504
        weights.check_like(half, {"w": np.zeros(2, np.float16), "steps": np.zeros(1, np.int64)})
    with pytest.raises(ValueError, match="precision"):
        weights.with_precision(arrays, "bfloat16")


def test_weights_round_trip_with_metadata_and_digest():
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}
    blob = weights.encode(arrays, {"num_samples": "12"})
    decoded, meta = weights.decode(blob)
    assert meta == {"num_samples": "12"}
    assert all(np.array_equal(decoded[k], arrays[k]) for k in arrays)
    weights.check_digest(blob, weights.sha256(blob))
    with pytest.raises(weights.WeightsError, match="sha256"):
        weights.check_digest(blob + b"x", weights.sha256(blob))


def test_the_same_weights_and_metadata_are_the_same_bytes_every_time():
    # safetensors alone writes metadata in a new hash map's order each save: a round's digest then changed
    arrays = {"w": np.arange(6, dtype=np.float32), "b": np.ones(3, np.float16)}
    metadata = {str(k): "é" * k for k in range(16)}  # more than two, and not ASCII
    blobs = {weights.encode(arrays, dict(reversed(metadata.items()))) for _ in range(20)}
    blobs.add(weights.encode(arrays, metadata))
    assert len(blobs) == 1
    (blob,) = blobs
    decoded, meta = weights.decode(blob)
    assert meta == metadata and all(np.array_equal(decoded[k], arrays[k]) for k in arrays)
    assert int.from_bytes(blob[:8], "little") % 8 == 0  # the data starts 8-byte aligned, as safetensors'


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


def _announcement(round: int, weights_round: int, onnx_round: int) -> bytes:
    ref = BlobRef(f"/api/models/{weights_round}/weights", "ab" * 32, 1234)
    onnx = BlobRef(f"/api/models/{onnx_round}/onnx", "cd" * 32, 99)
    return messages.encode(ModelAnnouncement(round, SPEC, ["zero", "one"], ref, onnx))


def test_announcement_names_only_its_own_rounds_files():
    assert messages.decode(_announcement(7, 7, 7), ModelAnnouncement).round == 7
    for payload in (_announcement(99999, 0, 0), _announcement(7, 7, 0)):
        with pytest.raises(ProtocolError, match="another round"):
            messages.decode(payload, ModelAnnouncement)


@pytest.mark.parametrize(
    ("path", "kind", "round"),
    [("/api/models/12/weights", "weights", 12), ("/api/models/0/onnx", "onnx", 0)],
)
def test_model_round_reads_exact_paths(path, kind, round):
    assert routes.model_round(path, kind) == round


@pytest.mark.parametrize(
    "path",
    [
        ":18081/api/models/1/onnx",
        "/api/models/1/onnx?x=1",
        "/api/models/01/onnx",
        "/api/models/1/weights",
        "/api/models/1/onnx/",
        "/api/../models/1/onnx",
        "//evil/api/models/1/onnx",
    ],
)
def test_model_round_refuses_any_other_path(path):
    with pytest.raises(ValueError, match="not the path"):
        routes.model_round(path, "onnx")


@pytest.mark.parametrize(
    ("base", "path"),
    [
        ("http://127.0.0.1", ":18081/api/models/1/onnx"),
        ("http://127.0.0.1:8080", "@evil.example/api/x"),
        ("http://127.0.0.1:8080", "/api/x/../../y"),
        ("http://127.0.0.1:8080", "/other/x"),
        ("ftp://127.0.0.1:8080", "/api/x"),
        ("http://127.0.0.1:8080", "/api/x%2f..%2f"),
    ],
)
def test_url_stays_on_the_coordinator(base, path):
    with pytest.raises(ValueError):
        routes.url(base, path)


def test_url_joins_an_api_path():
    assert (
        routes.url("https://coord.lan:8443/", "/api/models/3/onnx")
        == "https://coord.lan:8443/api/models/3/onnx"
    )


def test_a_task_topic_carries_a_task_or_a_withdrawal_and_nothing_else():
    for message in (TASK, TaskWithdrawal(["t1"])):
        assert messages.decode_either(messages.encode(message), Task, TaskWithdrawal) == message
    status = messages.encode(DeviceStatus("dev-1", "online"))
    with pytest.raises(ProtocolError, match="kind 'status', expected 'task' or 'withdrawal'"):
        messages.decode_either(status, Task, TaskWithdrawal)


@pytest.mark.parametrize(
    ("withdrawal", "reason"),
    [
        (TaskWithdrawal([f"t{i}" for i in range(65)]), "at most 64 task ids"),
        (TaskWithdrawal(["../t1"]), "at most 64 task ids"),
    ],
)
def test_a_withdrawal_names_few_task_ids_of_the_tasks_form(withdrawal, reason):
    with pytest.raises(ProtocolError, match=reason):
        messages.decode(messages.encode(withdrawal), TaskWithdrawal)


@pytest.mark.parametrize("reason", ["", "x" * (message_checks.MAX_FAILURE_CHARS + 1)])
def test_a_failure_report_gives_a_short_reason(reason):
    with pytest.raises(ProtocolError, match=f"reason: 1 to {message_checks.MAX_FAILURE_CHARS} characters"):
        messages.decode(messages.encode(TaskFailure(reason)), TaskFailure)
    assert (
        routes.failure("t1")
        == "/api/tasks/t1/failure"
        == routes.PREFIX + routes.FAILURE_RULE.replace("<task_id>", "t1")
    )


@pytest.mark.parametrize("issued_at", [-1.0, 2.0**41])
def test_an_announcements_time_is_bounded(issued_at):
    announcement = ModelAnnouncement(2, SPEC, ["zero", "one"], TASK.weights, issued_at=issued_at)
    with pytest.raises(ProtocolError, match="issued_at"):
        messages.decode(messages.encode(announcement), ModelAnnouncement)


def test_signed_messages_verify_only_with_the_key_and_topic():
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    body = messages.encode(TASK)
    payload = signing.sign(key, "fedspeech/v1/devices/a/task", body)
    assert signing.verify(key.public_key(), "fedspeech/v1/devices/a/task", payload) == body
    cases = {
        "another key": (other.public_key(), "fedspeech/v1/devices/a/task", payload),
        "another topic": (key.public_key(), "fedspeech/v1/devices/b/task", payload),
        "unsigned": (key.public_key(), "fedspeech/v1/devices/a/task", body),
        "tampered": (
            key.public_key(),
            "fedspeech/v1/devices/a/task",
            payload.replace(b'"body":"ey', b'"body":"ez'),
        ),
    }
    for public, topic, data in cases.values():
        with pytest.raises(ProtocolError):
            signing.verify(public, topic, data)


def test_public_key_round_trips_as_text_and_file(tmp_path):
    key = signing.load_or_create_key(tmp_path / "coordinator.key")
    assert (tmp_path / "coordinator.key").stat().st_mode & 0o777 == 0o600
    again = signing.load_or_create_key(tmp_path / "coordinator.key")
    text = signing.public_key_text(key)
    assert text == signing.public_key_text(again)
    (tmp_path / "coordinator.pub").write_text(text + "\n")
    for given in (text, str(tmp_path / "coordinator.pub")):
        assert signing.public_key_text(signing.load_public_key(given)) == text
    with pytest.raises(ProtocolError, match="Ed25519"):
        signing.parse_public_key("not a key")
