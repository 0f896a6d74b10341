"""Shared fixtures: the machine's Mosquitto, topic roots, coordinator and device processes, a microphone."""

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedspeech.bench import Run
from fedspeech.coordinator.store import RoundRecord
from fedspeech.fleet_run import free_port  # noqa: F401 - the tests import it from here
from fedspeech.protocol import messages, signing, weights
from fedspeech.protocol.messages import Credentials, DeviceStatus, ModelSpec, Profile, Registration, Task
from fedspeech.protocol.topics import Topics, parse_broker_url

MOSQUITTO = ("127.0.0.1", 1883)


# the corpora beside the repository: CI clones it next to a copy of shared/
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"no shared data at {SHARED_DATA}")


def made_up_run(
    corpus: str,
    arm: str,
    seed: int,
    accuracies: list[float],
    round_s: float = 10.0,
    mb_per_round: float = 0.002,
) -> Run:
    """A benchmark run with these accuracies, one round every round_s seconds moving mb_per_round MB."""
    rounds = [
        RoundRecord(
            round=i + 1,
            started_at=100.0 + i * round_s,
            finished_at=100.0 + (i + 1) * round_s,
            wall_s=round_s,
            devices=3,
            results=3,
            accuracy=acc,
            macro_f1=acc,
            loss=1.0,
            bytes_up=int(mb_per_round * 1e6 / 2),
            bytes_down=int(mb_per_round * 1e6 / 2),
            weights_sha256="00",
        )
        for i, acc in enumerate(accuracies)
    ]
    return Run(corpus, arm, seed, rounds, t0=100.0)


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.2):
    """Poll until predicate returns something truthy; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def get_json(url: str):
    """GET a JSON document, or None if the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())
    except OSError:
        return None


@pytest.fixture(scope="session")
def mosquitto_url() -> str:
    """The machine's Mosquitto broker; the suite needs it running."""
    try:
        socket.create_connection(MOSQUITTO, timeout=2).close()
    except OSError:
        pytest.fail("no MQTT broker on 127.0.0.1:1883: start Mosquitto (`mosquitto -d`)")
    return f"mqtt://{MOSQUITTO[0]}:{MOSQUITTO[1]}"


@pytest.fixture
def topic_root() -> str:
    """A topic root of its own, so tests sharing the broker never see each other's messages."""
    return f"fedspeech-test/{uuid.uuid4().hex[:12]}"


class Processes:
    """Started `fedspeech` subprocesses, logged to files, all stopped when the test ends."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *args: str) -> subprocess.Popen:
        """Run `python -m fedspeech ARGS` with its output in LOG_DIR/NAME.log."""
        log = open(self.log_dir / f"{name}.log", "a")  # noqa: SIM115 - closed with the process
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "fedspeech", *args], stdout=log, stderr=log, env=env)
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


@pytest.fixture
def processes(tmp_path) -> Iterator[Processes]:
    """Start subprocesses that are cleaned up after the test."""
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()


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
def one_round_coordinator(tmp_path: Path, broker_url: str, topic_root: str, device_id: str, **config: Any):
    """An in-process coordinator for one round of one device, and that device, which the test speaks for.

    Yields (app, service, device); config adds or overrides the coordinator's settings (open enrolment by
    default).
    """
    from fedspeech.coordinator.app import create_app

    settings = {"STATE_DIR": str(tmp_path / "state"), "BROKER_URL": broker_url, "TOPIC_ROOT": topic_root}
    rounds = {"ROUNDS": 1, "MIN_DEVICES": 1, "MIN_RESULTS": 1, "OPEN_ENROLMENT": True}
    app = create_app({**settings, **rounds, **config})
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

    Tasks must be signed by the coordinator's key: given, or pinned from the first registration.
    """

    def __init__(
        self, device_id: str, broker_url: str, topics: Topics, coordinator_key: Ed25519PublicKey | None = None
    ) -> None:
        host, port = parse_broker_url(broker_url)
        self.device_id, self.topics, self.coordinator_key = device_id, topics, coordinator_key
        self.tasks: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.token = ""
        self.mqtt = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        self.mqtt.on_connect = lambda c, *_: c.subscribe(topics.task(device_id), qos=1)
        self.mqtt.message_callback_add(topics.task(device_id), self._on_task)
        self.mqtt.connect(host, port)
        self.mqtt.loop_start()

    def _on_task(self, client, userdata, msg) -> None:
        if msg.payload:
            self.tasks.put((msg.topic, bytes(msg.payload)))

    def publish(self, topic: str, payload: bytes) -> None:
        """Publish retained, waiting for the broker to take it."""
        self.mqtt.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)

    def register(self, coordinator_url: str, num_samples: int, credential: str | None = None) -> str:
        """Register over HTTP with a credential (default: its current token, if any); keep the new token."""
        body = messages.encode(Registration(self.device_id, num_samples, Profile(1, 0.0, 256.0)))
        credential = credential or self.token
        headers = {"Authorization": f"Bearer {credential}"} if credential else {}
        request = urllib.request.Request(f"{coordinator_url}/api/devices", body, headers, method="POST")
        with urllib.request.urlopen(request, timeout=10) as reply:
            credentials = messages.decode(reply.read(), Credentials)
        self.token = credentials.token
        if self.coordinator_key is None:
            self.coordinator_key = signing.parse_public_key(credentials.coordinator_key)
        return self.token

    def go_online(self, num_samples: int) -> None:
        """Announce the device as online."""
        status = DeviceStatus(self.device_id, "online", num_samples)
        self.publish(self.topics.status(self.device_id), messages.encode(status))

    def next_task(self, timeout: float) -> Task:
        """The next task the coordinator hands out, its signature checked."""
        try:
            topic, payload = self.tasks.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"{self.device_id} got no task within {timeout} s")
        assert self.coordinator_key is not None, "register first, or give the coordinator's key"
        return messages.decode(signing.verify(self.coordinator_key, topic, payload), Task)

    def send_back_unchanged(self, coordinator_url: str, task: Task, num_samples: int) -> int:
        """Download the task's model and upload it untouched; return the HTTP status."""
        with urllib.request.urlopen(f"{coordinator_url}{task.weights.path}", timeout=10) as reply:
            arrays, _ = weights.decode(reply.read())
        body = weights.encode(arrays, {"task_id": task.task_id, "num_samples": str(num_samples)})
        headers = {"Authorization": f"Bearer {self.token}", "X-Content-SHA256": weights.sha256(body)}
        request = urllib.request.Request(f"{coordinator_url}{task.upload_path}", body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def close(self) -> None:
        """Clear this device's retained messages and disconnect."""
        self.publish(self.topics.status(self.device_id), b"")
        self.publish(self.topics.task(self.device_id), b"")
        self.mqtt.loop_stop()
        self.mqtt.disconnect()


@dataclass
class TrainedModel:
    """A CNN trained centrally on every FSDD speaker's training clips, exported to ONNX."""

    model: Any
    spec: ModelSpec
    labels: list[str]
    onnx_path: Path
    heldout: tuple[Any, Any]  # waveforms and labels of FSDD's test split, none of them trained on
    calibration: Any  # a few hundred training waveforms


@pytest.fixture(scope="session")
def fsdd_model(tmp_path_factory) -> TrainedModel:
    """Trained once per test session as devices train, with the bundled negatives (~40 s on one core)."""
    import numpy as np
    import torch

    from fedspeech.export.onnx_export import export_onnx
    from fedspeech.models import build_model
    from fedspeech.models.calibration import calibrate_threshold
    from fedspeech.models.clips.datasets import (
        bundled_data_dir,
        default_spec,
        load_corpus,
        load_waveforms,
        load_windows,
        server_test_clips,
    )
    from fedspeech.models.train import train_local
    from fedspeech.protocol.labels import is_word, none_class

    torch.set_num_threads(1)
    torch.manual_seed(0)
    corpus = load_corpus("fsdd")
    spec = default_spec(corpus)
    labels = corpus.task.labels
    waveforms, targets = load_waveforms(
        [c for c in corpus.clips if not c.test], spec.sample_rate, spec.num_samples
    )
    negatives = sorted((bundled_data_dir() / corpus.task.negatives[0]).glob("*.flac"))
    noise = np.concatenate([load_windows(f, spec.sample_rate, spec.num_samples, 1) for f in negatives])
    none = none_class(labels)
    model = build_model(spec)
    train_local(
        model,
        np.concatenate([waveforms, noise]),
        np.concatenate([targets, np.full(len(noise), none)]),
        epochs=6,
        batch_size=32,
        learning_rate=3e-3,
        noise=noise,
        none_class=none,
    )
    heldout = load_waveforms(server_test_clips(corpus), spec.sample_rate, spec.num_samples)
    with torch.no_grad():  # the threshold calibrated on the held-out clips, as the coordinator's exports
        probabilities = torch.softmax(model.eval()(torch.from_numpy(heldout[0])), dim=1).numpy()
    words = [i for i, label in enumerate(labels) if is_word(label)]
    threshold = calibrate_threshold(probabilities, heldout[1], words)
    folder = tmp_path_factory.mktemp("fsdd-model")
    path = export_onnx(model, spec, labels, folder / "model.onnx", round=1, task="fsdd", threshold=threshold)
    calibration = waveforms[np.random.default_rng(0).choice(len(waveforms), 300, replace=False)]
    return TrainedModel(model.eval(), spec, list(labels), path, heldout, calibration)


@pytest.fixture
def virtual_microphone(tmp_path, monkeypatch):
    """A private PulseAudio server with a null sink, fedspeech_mic; its monitor is the default source."""
    if not (shutil.which("pulseaudio") and shutil.which("paplay") and shutil.which("pactl")):
        pytest.skip("needs PulseAudio: apt-get install pulseaudio pulseaudio-utils libasound2-plugins")
    runtime = tmp_path / "pulse"
    runtime.mkdir()
    env = {**os.environ, "PULSE_RUNTIME_PATH": str(runtime), "PULSE_STATE_PATH": str(runtime)}
    command = [
        "pulseaudio",
        "--daemonize=no",
        "-n",  # no default.pa: none of the machine's sound cards
        "--exit-idle-time=-1",
        "--load=module-native-protocol-unix auth-anonymous=1",
        "--load=module-null-sink sink_name=fedspeech_mic",
    ]
    with open(tmp_path / "pulseaudio.log", "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    try:
        ready = lambda: subprocess.run(["pactl", "info"], env=env, capture_output=True).returncode == 0  # noqa: E731
        wait_for(ready, 15, "PulseAudio to start")
        monkeypatch.setenv("PULSE_RUNTIME_PATH", str(runtime))
        monkeypatch.setenv("PULSE_SOURCE", "fedspeech_mic.monitor")  # what ALSA's "pulse" device records
        yield env
    finally:
        server.terminate()
        server.wait(timeout=10)


def with_metadata(source: Path, out: Path, labels: list[str] | None = None, **changes: str | None) -> Path:
    """A copy of an ONNX file with some metadata changed (None: removed): same graph, same weights."""
    import json

    import onnx

    proto = onnx.load(source)
    metadata = {prop.key: prop.value for prop in proto.metadata_props} | changes
    if labels is not None:
        metadata["labels"] = json.dumps(labels)
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, {key: value for key, value in metadata.items() if value is not None})
    onnx.save(proto, out)
    return out
