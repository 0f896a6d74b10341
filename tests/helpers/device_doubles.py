"""A device daemon against a coordinator double: signed tasks and announcements, blobs over HTTP."""

import json
import logging
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.edge_client import ClientConfig, DataSource, run_client
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

BROKER_URL = "mqtt://127.0.0.1:1883"


SPEAKER = "jackson"


MAX_SAMPLES = 40


BLOB_PATH = "/api/models/0/weights"


UPLOAD_PATH = "/api/rounds/1/updates"


SPEC = ModelSpec("cnn", sample_rate=8000, num_samples=8000, num_classes=11)  # the digits and _none_


FSDD = BUILTIN_TASKS["fsdd"]


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
    acks: list[str] = field(default_factory=list)  # the tasks acknowledged, by id
    over: set[str] = field(default_factory=set)  # task ids whose acknowledgement is answered 409
    announcement: bytes | None = None  # the latest, signed, as GET /api/models/announcement serves it
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
                elif self.path == "/api/models/announcement" and double.announcement is not None:
                    self.reply(200, double.announcement)
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
                elif self.path.startswith("/api/tasks/") and self.path.endswith("/ack"):
                    task_id = self.path.split("/")[3]
                    if task_id in double.over:
                        self.reply(409, b'{"error": "its round is over"}')
                        return
                    double.acks.append(task_id)
                    self.reply(200, b"{}")
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
        payload = signing.sign(self.coordinator.key, self.topics.model, body)
        self.coordinator.announcement = payload
        self.publish(self.topics.model, payload)
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
