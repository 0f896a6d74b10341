"""`fedspeech listen`'s outputs besides printing, as real processes on a real Mosquitto: a Wyoming service
whose words also go out as MQTT events and hook runs; a listener following the fleet's coordinator that
publishes on the one login it follows the models with; and the options that cannot work, one line each.
"""

import asyncio
import json
import queue
import re
import shlex
import signal
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.ping import Ping, Pong
from wyoming.wake import Detect, Detection

from fedspeech.protocol import routes, weights
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import DEFAULT_DISCOVERY_PREFIX, Topics, event_discovery, listen_user
from fedspeech.runtime.session import OnnxModel
from fedspeech_bench.attacks.mosquitto import running_mosquitto
from tests.helpers.mqtt_clients import WAIT_S, Client
from tests.helpers.ports import free_port
from tests.helpers.recordings import held_out_digits
from tests.helpers.waiting import get_json, wait_for

RECORDINGS = Path(__file__).resolve().parents[2] / "data" / "fsdd" / "recordings"
FSDD_RATE, RATE, CHUNK = 8000, 16000, 1024  # a satellite's rate and chunk (samples)
PAUSE_S = 0.8
DETECTION = re.compile(r"^\s*(\d+\.\d+) s  (\S+)  \d\.\d\d$", re.MULTILINE)  # a line listen prints
ALREADY_CONNECTED = "already connected, closing old connection"  # Mosquitto, on a taken client id


def takes(digits: str, speaker: str, number: int) -> np.ndarray:
    """A speaker's held-out takes of digits (FSDD's recordings 0-4) at 8 kHz, PAUSE_S apart and around."""
    return held_out_digits(digits, speaker, number, PAUSE_S)[0]


def fedspeech(*args: str) -> subprocess.CompletedProcess:
    """Run `python -m fedspeech ARGS` to its end."""
    command = [sys.executable, "-m", "fedspeech", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def next_on(client: Client, topic: str) -> bytes:
    """The payload of the next message client receives on topic (others before it are skipped)."""
    while True:
        try:
            received, payload = client.messages.get(timeout=WAIT_S)
        except queue.Empty:
            pytest.fail(f"nothing arrived on {topic}")
        if received == topic:
            return payload


def clear_retained(settings: BrokerSettings, *topics: str) -> None:
    """Remove what the broker retains on topics."""
    client = Client(settings).connected()
    for topic in topics:
        client.publish(topic, b"", retain=True)
    client.close()


def stopped(proc: subprocess.Popen) -> int:
    """SIGTERM, as systemd stops the service; its exit code."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


# ---- a Wyoming service with every output ----


async def wake_words(port: int, audio: bytes) -> list[str]:
    """As Home Assistant asks a wake word service: detect, the audio in 16 kHz chunks, audio-stop; the
    words detected, up to the pong of a ping sent after it all.
    """
    client = AsyncTcpClient("127.0.0.1", port, connect_timeout=5, read_timeout=10)
    async with client as connection:
        await connection.write_event(Detect().event())
        await connection.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        for start in range(0, len(audio), 2 * CHUNK):
            chunk = AudioChunk(rate=RATE, width=2, channels=1, audio=audio[start : start + 2 * CHUNK])
            await connection.write_event(chunk.event())
        await connection.write_event(AudioStop().event())
        await connection.write_event(Ping(text="barrier").event())
        events: list[Event] = []
        while (event := await connection.read_event()) is not None and not Pong.is_type(event.type):
            events.append(event)
    assert event is not None, f"the service closed the connection after {events}"
    assert all(Detection.is_type(e.type) for e in events), events
    return [Detection.from_event(e).name or "" for e in events]


@pytest.mark.timeout(90)
def test_a_wyoming_service_publishes_each_word_and_runs_the_hook(
    fsdd_model, mosquitto_url, topic_root, processes, clients, tmp_path
):
    name = f"wyoming-{uuid.uuid4().hex[:8]}"  # the listener's broker user, on the machine's open broker
    topics, discovery = Topics(topic_root), event_discovery(DEFAULT_DISCOVERY_PREFIX, name)
    heard, hook = tmp_path / "heard.txt", tmp_path / "hook.sh"
    hook.write_text('#!/bin/sh\necho "$FEDSPEECH_LABEL $FEDSPEECH_ROUND" >> "$1"\n')
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    watcher = Client(BrokerSettings(mosquitto_url), (topics.all_listeners, discovery)).connected()
    clients.append(watcher)
    port = free_port()
    digits = "27183"
    audio = soxr.resample(takes(digits, "theo", 0), FSDD_RATE, RATE)
    pcm = (np.clip(audio, -1, 32767 / 32768) * 32768).astype("<i2").tobytes()
    try:
        proc = processes.start(
            "wyoming",
            "listen",
            "--model", str(fsdd_model.onnx_path),
            "--wyoming", f"tcp://127.0.0.1:{port}",
            "--on-detect", shlex.join([str(hook), str(heard)]),
            "--publish",
            "--broker", mosquitto_url,
            "--broker-username", name,
            "--topic-root", topic_root,
        )  # fmt: skip
        log = proc.log_path
        wait_for(lambda: "serving Wyoming on" in log.read_text() or proc.poll() is not None, 30, "serving")
        assert proc.poll() is None, log.read_text()
        assert next_on(watcher, topics.availability(name)) == b"online"
        config = json.loads(next_on(watcher, discovery))
        assert config["event_types"] == list("0123456789")
        assert config["state_topic"] == topics.detections(name)

        assert asyncio.run(wake_words(port, pcm)) == list(digits)  # in order, each once
        events = [json.loads(next_on(watcher, topics.detections(name))) for _ in digits]
        assert [e["event_type"] for e in events] == list(digits)
        assert all(e["listener"] == name and e["model_round"] == 1 for e in events), events
        wait_for(lambda: heard.exists() and len(heard.read_text().splitlines()) >= len(digits), 15, "hooks")
        assert heard.read_text().splitlines() == [f"{digit} 1" for digit in digits]

        assert stopped(proc) == 0, log.read_text()
        assert next_on(watcher, topics.availability(name)) == b"offline"
        text = log.read_text()
        assert "stopped serving Wyoming" in text and "Traceback" not in text, text
        assert "detection hook" not in text, text  # no run failed, none was dropped
    finally:
        clear_retained(BrokerSettings(mosquitto_url), topics.availability(name), discovery)


# ---- following the fleet's coordinator, on the one login of `fedspeech broker-config`'s Mosquitto ----

DEVICE = "kitchen-pi"


@pytest.mark.timeout(200)
def test_a_listener_following_the_coordinator_publishes_on_its_one_login(
    fsdd_model, topic_root, processes, clients, tmp_path
):
    from fedspeech.edge_client.coordinator_http import CoordinatorClient
    from fedspeech.edge_client.credentials import DeviceCredentials
    from fedspeech.models.train import get_arrays

    state, devices = tmp_path / "state", tmp_path / "devices"
    secret = tmp_path / f"{DEVICE}.secret"
    enrolled = fedspeech(
        "devices", "add", DEVICE, "--state", str(state), "--new-state", "--secret-file", str(secret)
    )
    assert enrolled.returncode == 0, enrolled.stderr
    port, http_port = free_port(), free_port()
    made = fedspeech("broker-config", "--state", str(state), "--port", str(port), "--topic-root", topic_root)
    assert made.returncode == 0, made.stderr
    broker, url = f"mqtt://127.0.0.1:{port}", f"http://127.0.0.1:{http_port}"
    start = tmp_path / "start.safetensors"  # round 0: the session's trained model, so that words are heard
    start.write_bytes(weights.encode(get_arrays(fsdd_model.model)))
    wav = tmp_path / "digits.wav"
    # 25 digits, about 33 s: round 1 reaches the listener 13-20 s in on a loaded two-core machine
    spoken = [takes("0123456789", "lucas", 1), takes("98765", "george", 2), takes("0123456789", "george", 3)]
    soundfile.write(wav, np.concatenate(spoken), FSDD_RATE)
    # the coordinator, with no held-out clips, calibrates no threshold: the session model's is used
    threshold = OnnxModel(fsdd_model.onnx_path).metadata["threshold"]
    topics, user = Topics(topic_root), listen_user(DEVICE)
    discovery = event_discovery(DEFAULT_DISCOVERY_PREFIX, user)

    with running_mosquitto(state / "broker" / "mosquitto.conf", port) as mosquitto:
        common = ["--broker", broker, "--topic-root", topic_root]
        coordinator = processes.start(
            "coordinator", "coordinator", "--state", str(state), "--port", str(http_port), *common,
            "--init", str(start), "--rounds", "1", "--min-devices", "1", "--min-results", "1",
            "--epochs", "1", "--lr", "1e-6", "--eval-every", "0",
        )  # fmt: skip
        wait_for(lambda: get_json(f"{url}{routes.ANNOUNCEMENT}") or coordinator.poll(), 90, "round 0", 0.5)
        assert coordinator.poll() is None, coordinator.log_path.read_text()
        # the device registers as its daemon does: its listener's password comes with its token
        stop = threading.Event()
        credentials = DeviceCredentials(devices / DEVICE)
        http = CoordinatorClient(url, DEVICE, stop, credentials, secret.read_text().strip())
        assert http.register(40, Profile(2, 1000.0, 512.0))
        assert (devices / DEVICE / "listen-password").is_file()

        home_assistant = BrokerSettings(broker, "homeassistant", state / "broker" / "homeassistant.password")
        watcher = Client(home_assistant, (topics.all_listeners, f"{DEFAULT_DISCOVERY_PREFIX}/#")).connected()
        clients.append(watcher)
        listener = processes.start(
            "listen", "listen", "--coordinator", url, *common, "--device-id", DEVICE, "--state", str(devices),
            "--publish", "--input", str(wav), "--realtime", "--threshold", threshold,
        )  # fmt: skip
        assert next_on(watcher, topics.availability(user)) == b"online"
        assert json.loads(next_on(watcher, discovery))["event_types"] == list("0123456789")
        first = json.loads(next_on(watcher, topics.detections(user)))
        assert (first["listener"], first["model_round"]) == (user, 0)
        # the device's daemon trains round 1 while the listener listens: it swaps the new model in
        daemon = processes.start(
            "daemon", "client", "--speaker", "jackson", "--device-id", DEVICE, "--coordinator", url, *common,
            "--state", str(devices), "--max-samples", "20",
        )  # fmt: skip
        assert listener.wait(timeout=90) == 0, listener.log_path.read_text()
        events = [first]  # every detection published, up to the listener's "offline" at its end
        while (message := watcher.messages.get(timeout=WAIT_S))[0] != topics.availability(user):
            if message[0] == topics.detections(user):
                events.append(json.loads(message[1]))
        assert message[1] == b"offline"
        assert daemon.poll() is None, daemon.log_path.read_text()

        text = listener.log_path.read_text()
        printed = [label for _, label in DETECTION.findall(text)]
        assert [e["event_type"] for e in events] == printed and len(printed) >= 12, (printed, events)
        rounds = [e["model_round"] for e in events]
        assert rounds == sorted(rounds) and rounds[0] == 0 and rounds.count(1) >= 5, rounds
        assert "logging in to the broker as kitchen-pi-listen" in text, text
        assert "swapped in model cnn round 1" in text, text
        assert "Traceback" not in text and "not connected to the broker" not in text, text
        logged = [(state / "broker" / "mosquitto.log").read_text(), mosquitto.log()]  # its file, its stderr
        assert not [log for log in logged if ALREADY_CONNECTED in log], logged
        assert mosquitto.log().count(f"as {user} (") == 1, mosquitto.log()  # one login, all along

        # the check above would have seen two connections of one user: a second Home Assistant
        Client(home_assistant).connected().close()
        wait_for(lambda: ALREADY_CONNECTED in mosquitto.log(), WAIT_S, "Mosquitto to log the takeover")


# ---- options that cannot work ----

BAD_OPTIONS = {  # the options, and what the one line says
    "--publish without a name": (
        ["--publish"],
        [
            "--publish needs the listener's broker user",
            "--device-id ID",
            "--publish-username",
            "--broker-username",
        ],
    ),
    "--on-detect naming no command": (
        ["--on-detect", "no-such-hook-command --loud"],
        ["detection hook's command 'no-such-hook-command'", "not found on PATH"],
    ),
    "--on-detect naming a file that is not executable": (
        ["--on-detect", "{not_executable} --loud"],
        ["detection hook's command '{not_executable}'", "is not executable"],
    ),
    "--on-detect with an unbalanced quote": (
        ["--on-detect", "unbalanced 'quote"],
        ["detection hook's command \"unbalanced 'quote\"", "No closing quotation"],
    ),
    "--wyoming not tcp": (["--wyoming", "http://x"], ["tcp://HOST:PORT", "not 'http://x'"]),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", BAD_OPTIONS, ids=list(BAD_OPTIONS))
def test_an_output_that_cannot_work_is_one_line(fsdd_model, case, tmp_path):
    not_executable = tmp_path / "hook.sh"
    not_executable.write_text("#!/bin/sh\n")
    options, fixes = BAD_OPTIONS[case]
    options = [option.format(not_executable=not_executable) for option in options]
    source = [] if "--wyoming" in options else ["--input", str(RECORDINGS / "3_theo_0.flac")]
    result = fedspeech("listen", "--model", str(fsdd_model.onnx_path), *source, *options)
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedspeech listen: "), result.stderr
    assert all(fix.format(not_executable=not_executable) in lines[0] for fix in fixes), lines[0]


@pytest.mark.timeout(60)
def test_a_device_id_with_a_dot_publishes_without_discovery_only(
    fsdd_model, mosquitto_url, topic_root, clients, tmp_path
):
    # a device enrolled as kitchen.pi, registered: its listener's password is in its state
    (tmp_path / "kitchen.pi").mkdir()
    (tmp_path / "kitchen.pi" / "listen-password").write_text("issued\n")
    (tmp_path / "kitchen.pi" / "listen-password").chmod(0o600)
    listen = ["listen", "--model", str(fsdd_model.onnx_path), "--input", str(RECORDINGS / "3_theo_0.flac")]
    listen += ["--publish", "--device-id", "kitchen.pi", "--state", str(tmp_path)]
    listen += ["--broker", mosquitto_url, "--topic-root", topic_root]
    result = fedspeech(*listen)
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    # it says how it would log in, then why it cannot publish so
    *logged, last = result.stderr.strip().splitlines()
    assert all(re.match(r"^\d{4}-\d\d-\d\d [\d:,]+ (INFO|WARNING) ", line) for line in logged), logged
    assert last.startswith("fedspeech listen: the listener name 'kitchen.pi-listen' "), last
    for fix in ("Home Assistant discovery", "letters, digits, '_' and '-' only", "an id without '.'"):
        assert fix in last, last

    # without discovery it publishes its words
    topics = Topics(topic_root)
    watcher = Client(BrokerSettings(mosquitto_url), (topics.all_listeners,)).connected()
    clients.append(watcher)
    try:
        result = fedspeech(*listen, "--no-discovery")
        assert result.returncode == 0, result.stderr
        event = json.loads(next_on(watcher, topics.detections("kitchen.pi-listen")))
        assert (event["event_type"], event["listener"]) == ("3", "kitchen.pi-listen")
    finally:
        clear_retained(BrokerSettings(mosquitto_url), topics.availability("kitchen.pi-listen"))


@pytest.mark.timeout(60)
def test_a_listener_publishes_as_the_user_it_logs_in_as(
    fsdd_model, mosquitto_url, topic_root, clients, tmp_path
):
    # the operator's own login wins over the one a device's daemon was issued: so do the topics' names,
    # which a broker's ACL knows the listener by (%u)
    topics = Topics(topic_root)
    watcher = Client(BrokerSettings(mosquitto_url), (topics.all_listeners,)).connected()
    clients.append(watcher)
    listen = ["listen", "--model", str(fsdd_model.onnx_path), "--input", str(RECORDINGS / "3_theo_0.flac")]
    listen += ["--publish", "--no-discovery", "--device-id", "kitchen-pi", "--state", str(tmp_path)]
    listen += ["--broker", mosquitto_url, "--broker-username", "hall-speaker", "--topic-root", topic_root]
    try:
        result = fedspeech(*listen)
        assert result.returncode == 0, result.stderr
        assert "without one" not in result.stderr  # it logs in with the login it was given
        event = json.loads(next_on(watcher, topics.detections("hall-speaker")))
        assert (event["event_type"], event["listener"]) == ("3", "hall-speaker")
    finally:
        clear_retained(BrokerSettings(mosquitto_url), topics.availability("hall-speaker"))
