"""The device daemon against the machine's Mosquitto and a small HTTP test double of the coordinator.

The double signs tasks and announcements with a real Ed25519 key, as the coordinator does; the helpers here
are shared with test_device_security.py.
"""

import json
import logging
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.edge_client import ClientConfig, DataSource, run_client
from fedspeech.models.clips.datasets import bundled_data_dir
from fedspeech.models.clips.tasks import BUILTIN_TASKS
from fedspeech.protocol import messages, signing, weights
from fedspeech.protocol.messages import (
    BlobRef,
    Credentials,
    DeviceStatus,
    EvaluationReport,
    ModelAnnouncement,
    ModelSpec,
    Registration,
    Task,
    TaskInfo,
)
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import Topics
from tests.helpers.ports import free_port

BROKER_URL = "mqtt://127.0.0.1:1883"
SPEAKER = "jackson"
MAX_SAMPLES = 40
BLOB_PATH = "/api/models/0/weights"
UPLOAD_PATH = "/api/rounds/1/updates"
SPEC = ModelSpec("cnn", sample_rate=8000, num_samples=8000, num_classes=11)  # the digits and _none_
FSDD = BUILTIN_TASKS["fsdd"]

pytestmark = pytest.mark.timeout(60)


@dataclass
class Upload:
    """One upload the coordinator double accepted."""

    path: str
    headers: Message  # case-insensitive, as HTTP header names are
    body: bytes

    @property
    def task_id(self) -> str:
        if self.path.endswith("/evaluations"):
            return messages.decode(self.body, EvaluationReport).task_id
        return weights.decode(self.body)[1]["task_id"]


@dataclass
class CoordinatorDouble:
    """Test double for the coordinator's HTTP API: registration, key, one weights blob, more files, uploads.

    It signs with key as the coordinator does. With a secret, enrolment is closed: a registration must
    carry the secret or the current token. Each registration issues a new token; uploads need the current one.
    """

    blob: bytes
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    secret: str | None = None
    token: str | None = None
    registrations: list[Registration] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)  # the header of each registration
    downloads: list[str] = field(default_factory=list)
    uploads: list[Upload] = field(default_factory=list)
    reject_tokens: int = 0  # answer this many uploads with 401, as a coordinator that revoked them would
    download_delay_s: float = 0.0  # a slow link: the weights arrive this long after they are asked for
    files: dict[str, bytes] = field(default_factory=dict)  # more blobs served by path
    endless: set[str] = field(default_factory=set)  # paths served as bytes without end
    sent: dict[str, int] = field(default_factory=dict)  # bytes sent of each endless path
    tls: ssl.SSLContext | None = None  # serve HTTPS with this server context
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{'localhost' if self.tls else host}:{port}"

    @property
    def public_key(self) -> str:
        return signing.public_key_text(self.key)

    def start(self) -> None:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args):
                pass

            def reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/api/status":
                    self.reply(200, b"{}")
                elif self.path == "/api/task":
                    self.reply(200, messages.encode(TaskInfo(FSDD, SPEC)))
                elif self.path == "/api/key":
                    self.reply(200, json.dumps({"coordinator_key": double.public_key}).encode())
                elif self.path == BLOB_PATH:
                    double.downloads.append(self.path)
                    time.sleep(double.download_delay_s)
                    self.reply(200, double.blob, "application/octet-stream")
                elif self.path in double.files:
                    double.downloads.append(self.path)
                    self.reply(200, double.files[self.path], "application/octet-stream")
                elif self.path in double.endless:
                    double.downloads.append(self.path)
                    self.send_response(200)
                    self.end_headers()
                    double.sent[self.path] = 0
                    try:
                        while True:
                            self.wfile.write(bytes(64 * 1024))
                            double.sent[self.path] += 64 * 1024
                    except OSError:
                        pass  # the client hung up
                else:
                    self.reply(404, b'{"error": "not found"}')

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                auth = self.headers["Authorization"]
                if self.path == "/api/devices":
                    registration = messages.decode(body, Registration)
                    double.registrations.append(registration)
                    double.authorizations.append(auth)
                    offered = auth.removeprefix("Bearer ") if auth else None
                    if double.secret is not None and offered not in {double.secret, double.token} - {None}:
                        self.reply(401 if auth else 403, b'{"error": "enrol this device first"}')
                        return
                    double.token = f"token-{uuid.uuid4().hex}"
                    credentials = Credentials(registration.device_id, double.token, double.public_key)
                    self.reply(200, messages.encode(credentials))
                elif self.path.startswith("/api/rounds/"):
                    if double.reject_tokens > 0 or auth != f"Bearer {double.token}":
                        double.reject_tokens -= 1
                        self.reply(401, b'{"error": "unknown token"}')
                    elif self.headers["X-Content-SHA256"] != weights.sha256(body):
                        self.reply(400, b'{"error": "digest mismatch"}')
                    else:
                        double.uploads.append(Upload(self.path, self.headers, body))
                        self.reply(200, b"{}")
                else:
                    self.reply(404, b'{"error": "not found"}')

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if self.tls is not None:
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Fleet:
    """One test's world: a fresh topic root and device id, the coordinator double, and an MQTT watcher."""

    topics: Topics
    device_id: str
    coordinator: CoordinatorDouble
    watcher: mqtt.Client
    state_dir: Path  # the device's own folder
    seen: list[tuple[str, bytes]] = field(default_factory=list)

    def config(self, **changes) -> ClientConfig:
        return replace(self._config(), **changes)

    def _config(self) -> ClientConfig:
        return ClientConfig(
            coordinator_url=self.coordinator.url,
            broker=BrokerSettings(BROKER_URL),
            device_id=self.device_id,
            data=DataSource(corpus="fsdd", speaker=SPEAKER),
            state_dir=self.state_dir,
            topic_root=self.topics.root,
            max_samples=MAX_SAMPLES,
        )

    def statuses(self, since: int = 0) -> list[DeviceStatus]:
        """The device's statuses seen, from the since-th message seen on."""
        topic = self.topics.status(self.device_id)
        payloads = [payload for t, payload in list(self.seen)[since:] if t == topic and payload]
        return [messages.decode(payload, DeviceStatus) for payload in payloads]

    def publish(self, topic: str, payload: bytes) -> None:
        self.watcher.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)

    def publish_task(self, payload: bytes) -> None:
        """Publish a raw payload on the device's task topic."""
        self.publish(self.topics.task(self.device_id), payload)

    def send_task(self, task: Task | bytes, key: Ed25519PrivateKey | None = None) -> None:
        """Publish a task (or any body) on the device's task topic, signed by key (the coordinator's)."""
        body = task if isinstance(task, bytes) else messages.encode(task)
        topic = self.topics.task(self.device_id)
        self.publish_task(signing.sign(key or self.coordinator.key, topic, body))

    def announce(self, round: int, onnx: bytes, sha256: str = "", **changes) -> ModelAnnouncement:
        """Serve onnx as round's model and publish its announcement, signed by the coordinator's key."""
        announcement = make_announcement(self.coordinator, round, onnx, sha256)
        announcement = replace(announcement, **changes)
        body = messages.encode(announcement)
        self.publish(self.topics.model, signing.sign(self.coordinator.key, self.topics.model, body))
        return announcement


def make_announcement(
    coordinator: CoordinatorDouble, round: int, onnx: bytes, sha256: str = ""
) -> ModelAnnouncement:
    """The announcement of round's model, its ONNX served by the coordinator double."""
    path = f"/api/models/{round}/onnx"
    coordinator.files[path] = onnx
    blob = coordinator.blob
    return ModelAnnouncement(
        round=round,
        spec=SPEC,
        labels=list(FSDD.labels),
        weights=BlobRef(f"/api/models/{round}/weights", weights.sha256(blob), len(blob)),
        onnx=BlobRef(path, sha256 or weights.sha256(onnx), len(onnx)),
    )


def wait_until(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def retained(topic: str, port: int = 1883, timeout: float = 3.0) -> bytes | None:
    """The retained payload on a topic, read by a fresh subscriber."""
    received: list[bytes] = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.on_connect = lambda c, *args: c.subscribe(topic, qos=1)
    client.on_message = lambda c, userdata, message: received.append(message.payload)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        wait_until(lambda: received, timeout=timeout)
    except AssertionError:
        return None
    finally:
        client.disconnect()
        client.loop_stop()
    return received[0]


def make_task(task_id: str = "task-1", *, blob: bytes, deadline_in: float = 50.0, sha256: str = "") -> Task:
    return Task(
        task_id=task_id,
        round=1,
        spec=SPEC,
        definition=FSDD,
        weights=BlobRef(BLOB_PATH, sha256 or weights.sha256(blob), len(blob)),
        upload_path=UPLOAD_PATH,
        epochs=1,
        batch_size=16,
        learning_rate=1e-3,
        deadline=time.time() + deadline_in,
    )


def evaluation(task: Task) -> Task:
    """The task as an evaluation of its round's model."""
    return replace(task, action="evaluate", upload_path="/api/rounds/1/evaluations")


@pytest.fixture(scope="module")
def reference() -> weights.Arrays:
    from fedspeech.models import build_model
    from fedspeech.models.train import get_arrays

    return get_arrays(build_model(SPEC))


@contextmanager
def fleet_of(coordinator: CoordinatorDouble, state_root: Path) -> Iterator[Fleet]:
    """A Fleet around a coordinator double, with a watcher subscribed to its topics; cleaned up on exit."""
    coordinator.start()
    topics = Topics(f"fedspeech-test/{uuid.uuid4().hex}")
    watcher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    device_id = f"dev-{uuid.uuid4().hex[:8]}"
    fleet = Fleet(topics, device_id, coordinator, watcher, state_root / device_id)
    connected = threading.Event()

    def on_connect(client, userdata, flags, reason_code, properties):
        client.subscribe(f"{topics.root}/#", qos=1)
        connected.set()

    watcher.on_connect = on_connect
    watcher.on_message = lambda c, userdata, message: fleet.seen.append((message.topic, message.payload))
    watcher.connect("127.0.0.1", 1883)
    watcher.loop_start()
    assert connected.wait(5)
    try:
        yield fleet
    finally:
        # leave no retained messages behind on the shared broker
        for topic in (topics.status(fleet.device_id), topics.task(fleet.device_id), topics.model):
            watcher.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)
        watcher.disconnect()
        watcher.loop_stop()
        coordinator.stop()


@pytest.fixture
def fleet(reference: weights.Arrays, tmp_path: Path) -> Iterator[Fleet]:
    with fleet_of(CoordinatorDouble(weights.encode(reference)), tmp_path / "device-state") as fleet:
        yield fleet


@contextmanager
def running_daemon(fleet: Fleet, **changes) -> Iterator[tuple[threading.Event, threading.Thread]]:
    """run_client in a thread, once it is online; stopped and joined on exit."""
    stop = threading.Event()
    thread = threading.Thread(target=run_client, args=(fleet.config(**changes), stop), daemon=True)
    before = len(fleet.seen)
    thread.start()
    try:
        wait_until(lambda: any(s.state == "online" for s in fleet.statuses(since=before)))
        yield stop, thread
    finally:
        stop.set()
        thread.join(15)
    assert not thread.is_alive()


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in list(caplog.records) if r.levelno >= logging.WARNING and text in r.getMessage()]


def test_full_task_round_trip(fleet: Fleet, reference: weights.Arrays) -> None:
    coordinator = fleet.coordinator
    with running_daemon(fleet) as (stop, thread):
        assert [r.num_samples for r in coordinator.registrations] == [MAX_SAMPLES]
        online = messages.decode(retained(fleet.topics.status(fleet.device_id)), DeviceStatus)
        assert (online.state, online.num_samples) == ("online", MAX_SAMPLES)
        assert online.profile.cpu_count >= 1 and online.profile.ram_available_mb > 0
        assert online.profile.seconds_per_sample > 0  # measured while warming up, before the first task

        fleet.send_task(make_task("task-1", blob=coordinator.blob))
        wait_until(lambda: coordinator.uploads)
        upload = coordinator.uploads[0]
        assert upload.path == UPLOAD_PATH
        assert upload.headers["Authorization"] == f"Bearer {coordinator.token}"
        assert upload.headers["Content-Type"] == "application/octet-stream"
        assert upload.headers["X-Content-SHA256"] == weights.sha256(upload.body)
        arrays, metadata = weights.decode(upload.body)
        weights.check_like(arrays, reference)
        assert any(not np.array_equal(arrays[name], reference[name]) for name in reference)
        assert metadata["task_id"] == "task-1" and metadata["device_id"] == fleet.device_id
        assert metadata["num_samples"] == str(MAX_SAMPLES)
        assert np.isfinite(float(metadata["train_loss"])) and float(metadata["seconds_per_sample"]) > 0

        assert any(s.state == "training" and s.round == 1 for s in fleet.statuses())
        wait_until(lambda: fleet.statuses()[-1].state == "online")
        assert fleet.statuses()[-1].profile.seconds_per_sample > 0
        stop.set()
        thread.join(15)
    offline = messages.decode(retained(fleet.topics.status(fleet.device_id)), DeviceStatus)
    assert offline.state == "offline"
    assert len(coordinator.uploads) == 1  # the retained task re-delivered by the broker is not redone


def test_task_withdrawn_before_upload_is_not_uploaded(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    coordinator = fleet.coordinator
    coordinator.download_delay_s = 2.0
    with running_daemon(fleet):
        fleet.send_task(make_task("task-1", blob=coordinator.blob))
        wait_until(lambda: coordinator.downloads)
        fleet.publish_task(b"")  # the round closed with other devices' results (cleared, unsigned)
        wait_until(lambda: warnings_about(caplog, "withdrew it"))
        assert coordinator.uploads == []
        wait_until(lambda: fleet.statuses()[-1].state == "online")

        coordinator.download_delay_s = 0.0
        fleet.send_task(make_task("task-2", blob=coordinator.blob))
        wait_until(lambda: coordinator.uploads)  # the next round's task is done as usual
        assert [u.task_id for u in coordinator.uploads] == ["task-2"]


def test_a_deeper_model_in_a_task_is_built_and_trained(fleet: Fleet) -> None:
    from fedspeech.models import build_model, depth_of
    from fedspeech.models.growth import grow
    from fedspeech.models.train import get_arrays

    shallow = ModelSpec("transformer", 8000, 8000, 11, depth=1)
    deep = ModelSpec("transformer", 8000, 8000, 11, depth=2)
    coordinator = fleet.coordinator
    coordinator.blob = weights.encode(get_arrays(build_model(shallow)))
    with running_daemon(fleet):
        for number, spec in enumerate((shallow, deep), start=1):
            if spec is deep:  # the coordinator grew the model between rounds
                coordinator.blob = weights.encode(grow(weights.decode(coordinator.blob)[0], deep, seed=1))
            fleet.send_task(replace(make_task(f"task-{number}", blob=coordinator.blob), spec=spec))
            wait_until(lambda n=number: len(coordinator.uploads) == n)
            assert depth_of(weights.decode(coordinator.uploads[-1].body)[0]) == spec.depth


def test_keeps_the_latest_global_model_as_onnx(fleet: Fleet, tmp_path, caplog) -> None:
    models = tmp_path / "models"
    kept = models / "model.onnx"
    fleet.announce(3, b"onnx of round 3")  # retained before the device starts
    with running_daemon(fleet, model_dir=models):
        wait_until(lambda: kept.exists())
        assert kept.read_bytes() == b"onnx of round 3"
        fleet.announce(4, b"onnx of round 4", sha256="0" * 64)  # corrupted on the way
        wait_until(lambda: warnings_about(caplog, "not keeping the model of round 4"))
        assert kept.read_bytes() == b"onnx of round 3", "a bad download never replaces the kept model"
        fleet.announce(5, b"onnx of round 5")
        wait_until(lambda: kept.read_bytes() == b"onnx of round 5")
    assert json.loads((models / "model.json").read_text())["round"] == 5


def test_malformed_tasks_are_logged_and_dropped(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fedspeech.edge_client")
    wrong_type = json.loads(messages.encode(make_task("bad", blob=fleet.coordinator.blob)))
    wrong_type["epochs"] = "one"
    with running_daemon(fleet) as (_, thread):
        fleet.publish_task(b"not json")
        wait_until(lambda: warnings_about(caplog, "not a signed message: not JSON"))
        # signed by the coordinator's key, yet not a task
        fleet.send_task(b"not json")
        wait_until(lambda: warnings_about(caplog, "not JSON: "))
        fleet.send_task(b"[" * 60_000)
        wait_until(lambda: warnings_about(caplog, "nested too deeply"))
        fleet.send_task(json.dumps(wrong_type).encode())
        wait_until(lambda: warnings_about(caplog, "epochs"))
        assert thread.is_alive()
        fleet.send_task(make_task("good", blob=fleet.coordinator.blob))
        wait_until(lambda: fleet.coordinator.uploads)
    assert [u.task_id for u in fleet.coordinator.uploads] == ["good"]


def test_wrong_digest_is_dropped(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fedspeech.edge_client")
    with running_daemon(fleet):
        fleet.send_task(make_task(blob=fleet.coordinator.blob, sha256="0" * 64))
        wait_until(lambda: warnings_about(caplog, "sha256 mismatch"))
        wait_until(lambda: fleet.statuses()[-1].state == "online")
    assert fleet.coordinator.downloads == [BLOB_PATH]
    assert fleet.coordinator.uploads == []


def test_expired_task_is_ignored(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fedspeech.edge_client")
    with running_daemon(fleet):
        fleet.send_task(make_task(blob=fleet.coordinator.blob, deadline_in=-5))
        wait_until(lambda: any("deadline has passed" in r.getMessage() for r in list(caplog.records)))
    assert fleet.coordinator.downloads == []
    assert fleet.coordinator.uploads == []


def test_refused_token_registers_again_and_retries(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    fleet.coordinator.reject_tokens = 1
    with running_daemon(fleet):
        fleet.send_task(make_task(blob=fleet.coordinator.blob))
        wait_until(lambda: fleet.coordinator.uploads)
    assert len(fleet.coordinator.registrations) == 2
    assert warnings_about(caplog, "the coordinator refused our token")
    # the second registration offered the token the first one issued
    assert fleet.coordinator.authorizations[1] is not None


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def private_broker(port: int) -> Iterator[None]:
    """A Mosquitto of our own that the test may stop and start (without persistence: it forgets retained)."""
    process = subprocess.Popen(["mosquitto", "-p", str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: listening(port), timeout=5)
        yield
    finally:
        process.terminate()
        process.wait(5)


@pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs the mosquitto binary")
def test_reconnects_and_takes_tasks_after_broker_restart(fleet: Fleet) -> None:
    port = free_port()
    config = fleet.config(broker=BrokerSettings(f"mqtt://127.0.0.1:{port}"))
    status_topic, task_topic = fleet.topics.status(fleet.device_id), fleet.topics.task(fleet.device_id)

    def state() -> str | None:
        payload = retained(status_topic, port, timeout=0.5)
        return messages.decode(payload, DeviceStatus).state if payload else None

    stop = threading.Event()
    thread = threading.Thread(target=run_client, args=(config, stop), daemon=True)
    try:
        with private_broker(port):
            thread.start()
            wait_until(state)
        with private_broker(port):
            wait_until(lambda: state() == "online")  # re-published after the automatic reconnect
            publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
            publisher.connect("127.0.0.1", port)
            publisher.loop_start()
            body = messages.encode(make_task(blob=fleet.coordinator.blob))
            task = signing.sign(fleet.coordinator.key, task_topic, body)
            publisher.publish(task_topic, task, qos=1, retain=True).wait_for_publish(5)
            publisher.disconnect()
            publisher.loop_stop()
            wait_until(lambda: fleet.coordinator.uploads)
            stop.set()
            thread.join(15)
            assert state() == "offline"
    finally:
        stop.set()
        thread.join(15)


def test_sigterm_goes_offline_and_exits_zero(fleet: Fleet, processes) -> None:
    process = processes.start("client", *client_args(fleet))
    wait_until(lambda: any(s.state == "online" for s in fleet.statuses()))
    process.terminate()
    assert process.wait(15) == 0
    status = messages.decode(retained(fleet.topics.status(fleet.device_id)), DeviceStatus)
    assert status.state == "offline"


def client_args(fleet: Fleet, max_samples: int | None = MAX_SAMPLES) -> list[str]:
    """`fedspeech client` arguments of the fleet's device; its state folder is fleet.state_dir."""
    args = [
        "client",
        "--coordinator", fleet.coordinator.url,
        "--broker", BROKER_URL,
        "--speaker", SPEAKER,
        "--device-id", fleet.device_id,
        "--topic-root", fleet.topics.root,
        "--state", str(fleet.state_dir.parent),
    ]  # fmt: skip
    return args + (["--max-samples", str(max_samples)] if max_samples is not None else [])


def test_evaluation_task_reports_counts_of_the_test_split(fleet: Fleet) -> None:
    coordinator = fleet.coordinator
    with running_daemon(fleet):
        fleet.send_task(evaluation(make_task("eval-1", blob=coordinator.blob)))
        wait_until(lambda: coordinator.uploads)
    upload = coordinator.uploads[0]
    assert upload.path == "/api/rounds/1/evaluations" and upload.headers["Content-Type"] == "application/json"
    report = messages.decode(upload.body, EvaluationReport)
    confusion = np.array(report.confusion)
    # FSDD's own split: takes 0-4 of each digit are the speaker's 50 test clips, 5 per digit
    assert confusion.shape == (11, 11) and confusion.sum(axis=1).tolist() == [5] * 10 + [0], "no _none_ tests"
    assert report.loss_sum > 0 and report.task_id == "eval-1"
    assert b"jackson" not in upload.body and b".flac" not in upload.body


def test_a_training_setting_the_device_does_not_know_is_refused(fleet: Fleet, caplog) -> None:
    coordinator = fleet.coordinator
    with running_daemon(fleet):
        fleet.send_task(replace(make_task("unknown", blob=coordinator.blob), config={"momentum_boost": 2.0}))
        wait_until(lambda: warnings_about(caplog, "unknown training setting 'momentum_boost'"))
        fleet.send_task(replace(make_task("negative", blob=coordinator.blob), config={"proximal_mu": -1.0}))
        wait_until(lambda: warnings_about(caplog, "proximal_mu = -1.0 is outside"))
        fleet.send_task(replace(make_task("fedprox", blob=coordinator.blob), config={"proximal_mu": 0.01}))
        wait_until(lambda: coordinator.uploads)
    assert [u.task_id for u in coordinator.uploads] == ["fedprox"]


def test_paths_outside_the_api_are_refused(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    evil = make_task("evil", blob=fleet.coordinator.blob)
    with running_daemon(fleet):
        for number, path in enumerate(
            (":18081/api/models/0/weights", "@evil.example/api/x", "/api/../../etc")
        ):
            # even signed by the coordinator's key, a task naming such a path is not one
            fleet.send_task(replace(evil, task_id=f"evil-{number}", weights=replace(evil.weights, path=path)))
            wait_until(lambda p=path: warnings_about(caplog, f"not the path of a round's weights: {p!r}"))
    assert fleet.coordinator.downloads == [] and fleet.coordinator.uploads == []


def _copy_takes(folder, digits: str, takes: range) -> None:
    for digit in digits:
        (folder / digit).mkdir(parents=True, exist_ok=True)
        for take in takes:
            name = f"{digit}_{SPEAKER}_{take}.flac"
            shutil.copyfile(bundled_data_dir() / "fsdd" / "recordings" / name, folder / digit / name)


def test_a_data_folder_is_scanned_again_at_each_task(fleet: Fleet, tmp_path, caplog) -> None:
    folder = tmp_path / "data"
    _copy_takes(folder, "012", range(20))
    (folder / "3").mkdir()
    (folder / "3" / "empty.wav").write_bytes(b"")
    coordinator = fleet.coordinator
    with running_daemon(fleet, data=DataSource(folder=folder), max_samples=None):
        wait_until(lambda: warnings_about(caplog, "empty.wav: empty file"))
        first = fleet.statuses()[-1]
        assert set(first.train_counts) | set(first.test_counts) == {"0", "1", "2"}
        assert sum(first.train_counts.values()) + sum(first.test_counts.values()) == 60
        fleet.send_task(make_task("task-1", blob=coordinator.blob))
        wait_until(lambda: coordinator.uploads)
        trained_on = int(weights.decode(coordinator.uploads[0].body)[1]["num_samples"])
        assert trained_on == sum(first.train_counts.values())

        _copy_takes(folder, "7", range(20))  # recorded while the daemon runs
        fleet.send_task(make_task("task-2", blob=coordinator.blob))
        wait_until(lambda: len(coordinator.uploads) == 2)
        now = fleet.statuses()[-1]
        assert now.train_counts["7"] + now.test_counts.get("7", 0) == 20
        assert int(weights.decode(coordinator.uploads[1].body)[1]["num_samples"]) == sum(
            now.train_counts.values()
        )
        # the split is a function of each file's path: old files kept their side
        assert {k: now.test_counts.get(k, 0) for k in "012"} == {
            k: first.test_counts.get(k, 0) for k in "012"
        }
    assert len(warnings_about(caplog, "empty.wav")) == 1, "a bad file is reported once, not at every task"
