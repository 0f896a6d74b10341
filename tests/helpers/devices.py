"""Devices in tests: `fedspeech` subprocesses, a device daemon per speaker, a device the test speaks for."""

import base64
import json
import os
import queue
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedspeech.coordinator.config import MAX_ACK_TIMEOUT_S
from fedspeech.protocol import messages, routes, signing, weights
from fedspeech.protocol.messages import Credentials, DeviceStatus, Profile, Registration, Task
from fedspeech.protocol.topics import Topics, parse_broker_url


def _signals_as_from_a_shell() -> None:
    """In the child before it runs: Ctrl-C and SIGTERM as a shell leaves them (default, not blocked),
    whatever the test worker's own state (a blocked or ignored SIGINT is inherited across exec).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


class Processes:
    """Started `fedspeech` subprocesses, logged to files, all stopped when the test ends."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(
        self, name: str, *args: str, cwd: Path | None = None, prefix: Sequence[str] = ()
    ) -> subprocess.Popen:
        """Run `python -m fedspeech ARGS` (in cwd, if given; after prefix, a command such as prlimit that
        runs it) with its output in LOG_DIR/NAME.log."""
        log = open(self.log_dir / f"{name}.log", "a")  # noqa: SIM115 - closed with the process
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        argv = [*prefix, sys.executable, "-m", "fedspeech", *args]
        proc = subprocess.Popen(
            argv, stdout=log, stderr=log, env=env, cwd=cwd, preexec_fn=_signals_as_from_a_shell
        )
        proc.log_path = self.log_dir / f"{name}.log"
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        """SIGTERM everything still running, then SIGKILL what does not exit."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start_clients(
    processes: Processes,
    speakers: list[str],
    coordinator_url: str,
    broker_url: str,
    topic_root: str,
    max_samples: int,
    *extra_args: str,
) -> list[subprocess.Popen]:
    """One device daemon per FSDD speaker, keeping its token in the test's folder; extra_args added."""
    return [
        processes.start(
            f"client-{s}",
            "client",
            "--speaker", s,
            "--coordinator", coordinator_url,
            "--broker", broker_url,
            "--topic-root", topic_root,
            "--max-samples", str(max_samples),
            "--state", str(processes.log_dir / "devices"),
            *extra_args,
        )
        for s in speakers
    ]  # fmt: skip


@contextmanager
def one_round_coordinator(tmp_path: Path, broker_url: str, topic_root: str, device_id: str, **settings: Any):
    """An in-process coordinator for one round of one device, and that device, which the test speaks for.

    Yields (app, service, device); settings, by name, add to or override the coordinator's (open enrolment
    by default).
    """
    from fedspeech.coordinator.app import create_app
    from tests.helpers.configs import coordinator_config

    places = {"broker": broker_url, "topic_root": topic_root}
    one_round = {"rounds": 1, "min_devices": 1, "min_results": 1, "open_enrolment": True}
    # the test's device acknowledges no task unless the test does: its rounds wait for it until their deadline
    one_round["ack_timeout"] = MAX_ACK_TIMEOUT_S
    app = create_app(coordinator_config(tmp_path, **places, **one_round).changed(**settings))
    service = app.extensions["fedspeech"]
    service.start()
    device = ScriptedDevice(device_id, broker_url, Topics(topic_root), service.key.public_key())
    try:
        yield app, service, device
    finally:
        device.close()
        service.stop()


class ScriptedDevice:
    """A device the test speaks for, step by step: a paho client on the real broker plus plain HTTP.

    Tasks must be signed by the coordinator's key: given, or pinned from the first registration. Once
    registered, it acknowledges each task it takes (next_task), as a device does; withdrawals are kept apart.
    """

    def __init__(
        self, device_id: str, broker_url: str, topics: Topics, coordinator_key: Ed25519PublicKey | None = None
    ) -> None:
        host, port = parse_broker_url(broker_url)
        self.device_id, self.topics, self.coordinator_key = device_id, topics, coordinator_key
        self.tasks: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.withdrawals: list[bytes] = []  # signed payloads, as they came
        self.token, self.url = "", ""
        self.mqtt = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        self.mqtt.on_connect = lambda c, *_: c.subscribe(topics.task(device_id), qos=1)
        self.mqtt.message_callback_add(topics.task(device_id), self._on_task)
        self.mqtt.connect(host, port)
        self.mqtt.loop_start()

    def _on_task(self, client, userdata, msg) -> None:
        if not msg.payload:
            return
        if signed_kind(msg.payload) == "withdrawal":
            self.withdrawals.append(bytes(msg.payload))
        else:
            self.tasks.put((msg.topic, bytes(msg.payload)))

    def publish(self, topic: str, payload: bytes) -> None:
        """Publish retained, waiting for the broker to take it."""
        self.mqtt.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)

    def register(
        self,
        coordinator_url: str,
        num_samples: int,
        credential: str | None = None,
        test_counts: dict[str, int] | None = None,
    ) -> str:
        """Register over HTTP with a credential (default: its current token, if any); keep the new token."""
        registration = Registration(self.device_id, num_samples, Profile(1, 0.0, 256.0), test_counts or {})
        body = messages.encode(registration)
        credential = credential or self.token
        headers = {"Authorization": f"Bearer {credential}"} if credential else {}
        request = urllib.request.Request(f"{coordinator_url}/api/devices", body, headers, method="POST")
        with urllib.request.urlopen(request, timeout=10) as reply:
            credentials = messages.decode(reply.read(), Credentials)
        self.token, self.url = credentials.token, coordinator_url
        if self.coordinator_key is None:
            self.coordinator_key = signing.parse_public_key(credentials.coordinator_key)
        return self.token

    def go_online(self, num_samples: int) -> None:
        """Announce the device as online."""
        status = DeviceStatus(self.device_id, "online", num_samples)
        self.publish(self.topics.status(self.device_id), messages.encode(status))

    def next_task(self, timeout: float) -> Task:
        """The next task the coordinator hands out, its signature checked; acknowledged once registered."""
        try:
            topic, payload = self.tasks.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"{self.device_id} got no task within {timeout} s")
        return self.take(topic, payload)

    def take(self, topic: str, payload: bytes) -> Task:
        """A task received on topic, its signature checked; acknowledged once registered."""
        assert self.coordinator_key is not None, "register first, or give the coordinator's key"
        task = messages.decode(signing.verify(self.coordinator_key, topic, payload), Task)
        if self.url:
            headers = {"Authorization": f"Bearer {self.token}"}
            assert post(f"{self.url}{routes.ack(task.task_id)}", b"", headers) == 200, "the acknowledgement"
        return task

    def send_back_unchanged(self, coordinator_url: str, task: Task, num_samples: int) -> int:
        """Download the task's model and upload it untouched; return the HTTP status."""
        body = unchanged_update(coordinator_url, task, num_samples)
        return upload(coordinator_url, task.upload_path, self.token, body)

    def close(self) -> None:
        """Clear this device's retained messages and disconnect."""
        self.publish(self.topics.status(self.device_id), b"")
        self.publish(self.topics.task(self.device_id), b"")
        self.mqtt.loop_stop()
        self.mqtt.disconnect()


def signed_kind(payload: bytes) -> str | None:
    """The kind of the message in a signed envelope, its signature unchecked; None if it holds none."""
    try:
        return json.loads(base64.b64decode(json.loads(payload)["body"]))["kind"]
    except (ValueError, KeyError, TypeError):
        return None


def unchanged_update(url: str, task: Task, num_samples: int | str) -> bytes:
    """The task's global model downloaded and sent back untouched, claiming num_samples, as an upload body."""
    with urllib.request.urlopen(f"{url}{task.weights.path}", timeout=10) as reply:
        arrays, _ = weights.decode(reply.read())
    return weights.encode(arrays, {"task_id": task.task_id, "num_samples": str(num_samples)})


def upload(url: str, path: str, token: str, body: bytes) -> int:
    """POST an update with its bearer token and digest; the HTTP status."""
    headers = {"Authorization": f"Bearer {token}", "X-Content-SHA256": weights.sha256(body)}
    return post(f"{url}{path}", body, headers)


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST body to url; the HTTP status, an error's included."""
    request = urllib.request.Request(url, body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
