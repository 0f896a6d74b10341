"""The attacks a live deployment was found open to, each mounted against a running fleet.

An attack's mount runs in a thread of its own from the first round until the fleet has finished, then
reads what it can of the outcome (statuses, logs) into its Evidence. `tried` counts its attempts and
`refused` those turned away at the door (an HTTP 4xx, a model not loaded); an attack whose messages are
accepted and then have no effect refuses nothing, and is judged by how far the fleet drifted.
"""

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt

from fedspeech.protocol import messages, routes
from fedspeech.protocol.messages import Credentials, DeviceStatus, Profile, Registration
from fedspeech.protocol.topics import parse_broker_url
from fedspeech_bench.attacks.live_fleet import LiveFleet, enrol
from fedspeech_bench.attacks.strangers import Stranger

SLOW_CLIENTS, SLOW_SOURCE = 64, "127.0.0.2"  # another address of this host: the API caps connections by it
GHOST = "switched-off"  # enrolled and registered, then down: a stranger says it is online
INJECTED = "FORGED-LINE"  # what a log-injection attempt puts at the start of a line of its own


@dataclass
class Evidence:
    """What an attack saw: attempts, those refused at the door, and a few words on the rest."""

    tried: int = 0
    refused: int = 0
    notes: list[str] = field(default_factory=list)
    failed: str = ""  # why the attack itself could not be mounted, if it could not


Mount = Callable[[LiveFleet, threading.Event, Evidence], None]


@dataclass(frozen=True)
class Attack:
    """An attack: its name, one line on what it does, how it is mounted and what it may cost a round."""

    name: str
    what: str
    mount: Mount
    insider: str = "none"  # the attack of the enrolled device the bench runs (fleets.poisoning), if any
    round_time_allowance_s: float = 3.0  # what a defended round may take longer than a clean one
    secure: bool = False  # run under secure aggregation, against a clean run under it


def _no_mount(fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    stop.wait()


def _compromised(fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    stop.wait()
    log = fleet.log()
    bounded = len(re.findall(r"claims 100000 samples; counted as", log))
    # the evaluation phase's line, once a report (the API logs its refusal again)
    reports = len(re.findall(r"evaluation_phase: round \d+: \S+'s evaluation report refused: more test", log))
    left_out = len(re.findall(r"change points away from the other devices' .*: left out", log))
    evidence.tried, evidence.refused = bounded + reports, reports
    evidence.notes.append(
        f"{bounded} uploads counted at the bound, {left_out} left out for their direction, "
        f"{reports} faked reports refused"
    )


def _secure_insider(fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    stop.wait()
    log = fleet.log()
    named = len(re.findall(r"handed out shares that did not open", log))
    refused = len(re.findall(r"the secure sum's norm is .* a device did not bound its own", log))
    short = len(re.findall(r"masked update .* not \d+ uint32|a masked update of \d+ bytes", log))
    evidence.notes.append(
        f"{named} rounds left its update out for shares that did not open, {refused} sums refused as too "
        f"long, {short} short vectors refused"
    )


def _slow_clients(fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    port = str(fleet.url.rsplit(":", 1)[1])
    longest = 0.0
    while not stop.is_set():
        argv = [sys.executable, "-m", "fedspeech_bench.attacks.slow_clients", "127.0.0.1", port]
        argv += ["--count", str(SLOW_CLIENTS), "--seconds", "20", "--source", SLOW_SOURCE]
        seen = json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=90).stdout)
        evidence.tried += seen["opened"]
        longest = max(longest, seen["longest_open_s"])
        evidence.notes = [f"{SLOW_CLIENTS} at a time from {SLOW_SOURCE}, each held at most {longest:.1f} s"]


def _upload_bursts(fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    insider, port = fleet.device_ids[-1], fleet.url.rsplit(":", 1)[1]
    slowest, burst_round = 0.0, 0
    while not stop.wait(0.2):
        open_round = fleet.status().get("open_round")
        if open_round is None or open_round == burst_round or not fleet.token(insider):
            continue
        burst_round = open_round  # one burst a round, with a device's token, at its open task's path
        argv = [sys.executable, "-m", "fedspeech_bench.attacks.upload_burst", port, fleet.token(insider)]
        argv += [routes.updates(open_round), routes.updates(open_round + 1)]
        sent = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        uploads = [u for burst in json.loads(sent.stdout) for u in burst]
        evidence.tried += len(uploads)
        evidence.refused += sum(400 <= u["status"] < 500 for u in uploads)
        slowest = max([slowest, *(u["ms"] for u in uploads)])
        evidence.notes = [f"16 x 64 MiB and 4 x 36 MB headers a round; slowest refusal {slowest:.0f} ms"]


def _http(fleet: LiveFleet, request: bytes) -> int:
    """Send a raw request; the answer's status (0: closed without one)."""
    with socket.create_connection(("127.0.0.1", int(fleet.url.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(request)
        reply = sock.recv(64)
    return int(reply[9:12]) if reply.startswith(b"HTTP/1.1 ") else 0


def _bad_requests(fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    takeover = messages.encode(Registration(fleet.device_ids[0], 100_000, Profile(1, 0.0, 256.0)))
    requests = [
        b"POST /api/devices HTTP/1.1\r\nHost: c\r\nContent-Length: -1\r\n\r\n",
        f"GET /api/{INJECTED}%0A{INJECTED}%20x HTTP/1.1\r\nHost: c\r\n\r\n".encode(),
        b"GET /api/models/..%2F..%2Fstate.sqlite3/onnx HTTP/1.1\r\nHost: c\r\n\r\n",
        b"POST /api/devices HTTP/1.1\r\nHost: c\r\nContent-Length: %d\r\n\r\n%s" % (len(takeover), takeover),
        b"GET /api/devices HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer " + b"x" * 43 + b"\r\n\r\n",
    ]
    stranger, topics = Stranger(fleet.broker_url, fleet.topics), 0
    try:
        while not stop.wait(1.0):
            for request in requests:
                evidence.tried += 1
                evidence.refused += 400 <= _http(fleet, request) < 500
            topics += 1  # a status on a topic that would start a line of its own in the coordinator's log
            stranger.publish(fleet.topics.status(f"x\n{INJECTED} y"), b"{}")
    finally:
        stranger.close()
    forged = len(re.findall(rf"^{INJECTED}", fleet.log(), re.MULTILINE))
    evidence.tried += topics
    evidence.refused += max(0, topics - forged)
    evidence.notes.append(
        f"Content-Length -1, {INJECTED} in a path and a topic, ../ in a path, a takeover, admin guesses; "
        f"{forged} forged log lines"
    )


def _withdrawals(fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    stranger = Stranger(fleet.broker_url, fleet.topics)

    def clear(client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        if msg.payload:  # a task: an empty retained message in its place, as anyone on the broker can send
            client.publish(msg.topic, b"", qos=1, retain=True)
            evidence.tried += 1

    stranger.client.message_callback_add(fleet.topics.task("+"), clear)
    stranger.client.subscribe(fleet.topics.task("+"), qos=1)
    try:
        stop.wait()
    finally:
        stranger.close()
    ignored = sum(_device_log(fleet, d).count("nothing is withdrawn") for d in fleet.device_ids)
    evidence.notes.append(
        f"every task cleared from the broker; devices logged {ignored} as withdrawing nothing"
    )


def _device_log(fleet: LiveFleet, device_id: str) -> str:
    path = fleet.run_dir / "logs" / f"{device_id}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _register(fleet: LiveFleet, device_id: str, secret: str) -> str:
    """Register a device over HTTP with its enrolment secret; its token."""
    body = messages.encode(Registration(device_id, 400, Profile(1, 0.0, 256.0)))
    request = urllib.request.Request(
        f"{fleet.url}/api/devices", body, {"Authorization": f"Bearer {secret}"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return messages.decode(reply.read(), Credentials).token


def _forged_online(fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    _register(fleet, GHOST, enrol(fleet.state, GHOST, fleet.run_dir).read_text().strip())
    stranger = Stranger(fleet.broker_url, fleet.topics)
    online = messages.encode(DeviceStatus(GHOST, "online", 400))
    try:
        while not stop.wait(1.0):
            stranger.publish(fleet.topics.status(GHOST), online, retain=True)
            evidence.tried += 1
    finally:
        stranger.close()
    evidence.notes.append(f"{GHOST} (down) said online every second")


def _forged_statuses(fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    stranger = Stranger(fleet.broker_url, fleet.topics)
    try:
        while not stop.wait(0.5):
            for device_id in fleet.device_ids:
                status = DeviceStatus(device_id, "online", 1)  # one sample: a weight near nothing
                stranger.publish(fleet.topics.status(device_id), messages.encode(status))
                evidence.tried += 1
    finally:
        stranger.close()
    evidence.notes.append("every device's status with num_samples = 1, twice a second")


def _client_ids(fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    host, port = parse_broker_url(fleet.broker_url)
    while not stop.is_set():
        for device_id in fleet.device_ids:
            if stop.is_set():
                break
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=device_id)
            try:
                client.connect(host, port)
                client.loop_start()
                stop.wait(1.0)
                evidence.tried += 1
            except OSError:
                evidence.refused += 1
            finally:
                client.loop_stop()
                client.disconnect()
    evidence.notes.append("a device's client id taken, one device after another, for a second each")


def _rollback(fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    from fedspeech.protocol.mqtt import BrokerSettings
    from fedspeech.runtime.model_follower import ModelFollower

    stranger = Stranger(fleet.broker_url, fleet.topics)
    key = (fleet.state / "coordinator.pub").read_text().strip()
    loaded: list[str] = []
    try:
        while not stop.wait(1.0):
            done = fleet.status().get("completed_round") or 0
            if done < 2 or 0 not in stranger.announcements or len(loaded) >= 2 * (done - 1):
                continue
            for replay in (stranger.announcements[0], b""):  # round 0's, genuine; then none at all
                stranger.publish(fleet.topics.model, replay, retain=True)
                folder = fleet.run_dir / f"listener-{len(loaded)}"
                follower = ModelFollower(
                    fleet.url, BrokerSettings(fleet.broker_url), fleet.topics.root, key, state_dir=folder
                )
                follower.start()
                try:
                    model, deadline = None, time.monotonic() + 30
                    while model is None and time.monotonic() < deadline:
                        model = follower.model
                        time.sleep(0.1)
                finally:
                    follower.stop()
                evidence.tried += 1
                described = model.describe() if model is not None else "no model"
                loaded.append(described)
                evidence.refused += model is not None and not described.endswith(" round 0")
    finally:
        stranger.close()
    evidence.notes.append(f"new listeners after round 0's announcement or none was retained loaded: {loaded}")


# the compromised device's attacks on secure aggregation (attacks.secure_insider), each under it
SECURE_INSIDERS = {
    "random_shares": "an enrolled device hands out shares that open for no one",
    "silent_after_keys": "an enrolled device agrees keys, then goes silent",
    "short_vector": "an enrolled device sends its masked vector 4 bytes short",
    "unbounded": "an enrolled device sends its change reversed x 1,000, unclipped",
}
ATTACKS = {
    attack.name: attack
    for attack in [
        Attack(
            "compromised_device",
            "an enrolled device claims 100,000 samples, uploads -3 x the global weights, fakes its reports",
            _compromised,
            insider="scaled_global",
        ),
        Attack(
            "slow_clients", f"{SLOW_CLIENTS} connections send a byte a second, headers or body", _slow_clients
        ),
        Attack(
            "upload_bursts", "a token holder's 64 MiB uploads and 36 MB safetensors headers", _upload_bursts
        ),
        Attack(
            "bad_requests", "absurd lengths, log injection, traversal, takeover, admin guesses", _bad_requests
        ),
        Attack("withdrawn_tasks", "a stranger clears every task the broker retains", _withdrawals),
        # a device that never takes its task costs a round its acknowledgement timeout (10 s), no more
        Attack(
            "forged_online",
            "a stranger says an enrolled device that is down is online",
            _forged_online,
            round_time_allowance_s=13.0,
        ),
        Attack("forged_statuses", "a stranger says every device holds one sample", _forged_statuses),
        Attack("client_ids", "a stranger connects with each device's client id in turn", _client_ids),
        Attack(
            "rollback", "a stranger retains round 0's announcement, or none, for new listeners", _rollback
        ),
        *(
            Attack(f"secure_{name}", what, _secure_insider, insider=name, secure=True)
            for name, what in SECURE_INSIDERS.items()
        ),
    ]
}
CLEAN = Attack("none", "no attack: the reference", _no_mount)
CLEAN_SECURE = Attack(
    "none_secure", "no attack, under secure aggregation: the reference", _no_mount, secure=True
)
