"""The shipped Mosquitto config and ACL (deploy/), with TLS and passwords: who may read and write what.

Mosquitto runs with exactly deploy/mosquitto.conf and deploy/mosquitto.acl, only its file paths, ports and
persistence location changed, with certificates from deploy/make-certs.sh and a password file from
mosquitto_passwd. Negative checks never sleep: each ends with a message that can only arrive after the
forbidden one would have (Mosquitto handles one connection's packets in order and delivers in order).
"""

import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedspeech.protocol import messages, signing
from fedspeech.protocol.messages import MAX_MESSAGE_BYTES, ModelAnnouncement
from fedspeech.protocol.mqtt import BrokerSettings, LastWill, make_client
from fedspeech.protocol.topics import Topics
from fedspeech_bench.attacks.mosquitto import listening
from tests.helpers.devices import Processes
from tests.helpers.mqtt_clients import WAIT_S, Client
from tests.helpers.ports import free_port
from tests.helpers.waiting import wait_for

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
TOPICS = Topics("fedspeech/v1")  # the root the ACL names
# kitchen-pi-listen: a `fedspeech listen` on kitchen-pi; jackson: the FSDD speaker of the full round
USERS = ["coordinator", "kitchen-pi", "hall-pi", "kitchen-pi-listen", "jackson"]

pytestmark = pytest.mark.timeout(300)


@dataclass
class Broker:
    """A running Mosquitto of the shipped config: its two listeners and the files clients need."""

    folder: Path
    plain_port: int
    tls_port: int
    log: Path

    @property
    def ca(self) -> Path:
        """The fleet CA that signed the broker's certificate."""
        return self.folder / "certs" / "ca.crt"

    def password_file(self, user: str) -> Path:
        """The file holding user's password."""
        return self.folder / f"{user}.password"

    def settings(self, user: str | None, tls: bool = True, **changes) -> BrokerSettings:
        """How user logs in: over TLS with the fleet CA, or to the local plain listener; changes override."""
        fields = {"username": user, "password_file": self.password_file(user) if user else None}
        if tls:
            fields |= {"url": f"mqtts://127.0.0.1:{self.tls_port}", "ca_file": self.ca}
        else:
            fields |= {"url": f"mqtt://127.0.0.1:{self.plain_port}"}
        return BrokerSettings(**(fields | changes))


def make_certs(out: Path, *args: str) -> None:
    """Run deploy/make-certs.sh."""
    subprocess.run([str(DEPLOY / "make-certs.sh"), str(out), *args], check=True, capture_output=True)


def shipped_config(folder: Path, plain_port: int, tls_port: int) -> str:
    """deploy/mosquitto.conf with its paths under folder and the given ports, and nothing else changed."""
    text = (DEPLOY / "mosquitto.conf").read_text()
    substitutions = {
        "/etc/mosquitto/fedspeech.passwd": str(folder / "passwd"),
        "/etc/mosquitto/fedspeech.acl": str(folder / "acl"),
        "/etc/mosquitto/certs/": f"{folder}/certs/",
        "listener 1883 127.0.0.1\n": f"listener {plain_port} 127.0.0.1\n",
        "listener 8883\n": f"listener {tls_port}\n",
        "persistence_location /var/lib/mosquitto/\n": f"persistence_location {folder}/data/\n",
        "/var/log/mosquitto/mosquitto.log": str(folder / "mosquitto.log"),
    }
    for old, new in substitutions.items():
        assert old in text, f"deploy/mosquitto.conf no longer has {old!r}: update this test"
        text = text.replace(old, new)
    settings = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert not [line for line in settings if "/etc/" in line or "/var/" in line], "a path left unchanged"
    return text


@pytest.fixture
def broker_folder(tmp_path) -> Iterator[Path]:
    """Where the broker's files go. Started as root, Mosquitto runs as user mosquitto, and tmp_path's
    parents are private to root: then the folder is a temporary one of its own, handed to mosquitto."""
    if os.geteuid() != 0:
        yield tmp_path / "broker"
        return
    folder = Path(tempfile.mkdtemp(prefix="fedspeech-broker-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def start_broker(folder: Path, config: str) -> tuple[subprocess.Popen, Broker]:
    """Certificates, passwords and the ACL in folder, then Mosquitto with config (from shipped_config)."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    make_certs(folder / "certs", "--device", "kitchen-pi")
    shutil.copyfile(DEPLOY / "mosquitto.acl", folder / "acl")
    (folder / "passwd").touch(mode=0o600)
    for user in USERS:  # as DEVICES.md adds them: the password on stdin, never on a command line
        password = secrets.token_hex(24)
        (folder / f"{user}.password").write_text(password + "\n")
        (folder / f"{user}.password").chmod(0o600)
        typed = f"{password}\n{password}\n"
        subprocess.run(["mosquitto_passwd", str(folder / "passwd"), user], input=typed, text=True, check=True)
    (folder / "mosquitto.conf").write_text(config)
    if os.geteuid() == 0:  # Mosquitto drops to user mosquitto before it reads any of these
        for path in [folder, *folder.rglob("*")]:
            shutil.chown(path, "mosquitto")
    ports = [int(line.split()[1]) for line in config.splitlines() if line.startswith("listener ")]
    broker = Broker(folder, ports[0], ports[1], folder / "mosquitto.log")
    with open(folder / "mosquitto.out", "w") as out:
        proc = subprocess.Popen(["mosquitto", "-c", str(folder / "mosquitto.conf")], stdout=out, stderr=out)

    def serving() -> bool:
        assert proc.poll() is None, f"mosquitto exited: {read_logs(broker)}"
        return all(listening(port) for port in ports)

    wait_for(serving, WAIT_S, "Mosquitto to listen")
    return proc, broker


def read_logs(broker: Broker) -> str:
    """Mosquitto's own log and its output, for failure messages."""
    return "\n".join(p.read_text() for p in (broker.log, broker.folder / "mosquitto.out") if p.exists())


@pytest.fixture
def broker(broker_folder) -> Iterator[Broker]:
    """Mosquitto with the shipped config, on spare ports."""
    config = shipped_config(broker_folder, free_port(), free_port())
    proc, running = start_broker(broker_folder, config)
    try:
        yield running
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        print(read_logs(running))  # shown by pytest when the test failed


def test_a_device_reads_the_model_and_its_own_task_and_writes_its_status(broker, clients):
    coordinator = Client(broker.settings("coordinator", tls=False), (TOPICS.all_status,)).connected()
    clients.append(coordinator)
    coordinator.publish(TOPICS.model, b"model 1", retain=True)
    coordinator.publish(TOPICS.task("kitchen-pi"), b"task for kitchen-pi", retain=True)

    device = Client(broker.settings("kitchen-pi"), (TOPICS.model, TOPICS.task("kitchen-pi"))).connected()
    clients.append(device)
    device.until(TOPICS.model, b"model 1")
    device.until(TOPICS.task("kitchen-pi"), b"task for kitchen-pi")
    # a listener on the same device logs in as a user of its own, beside the daemon
    listener = Client(broker.settings("kitchen-pi-listen"), (TOPICS.model,)).connected()
    clients.append(listener)
    listener.until(TOPICS.model, b"model 1")
    coordinator.publish(TOPICS.model, b"model 2", retain=True)
    device.until(TOPICS.model, b"model 2")
    listener.until(TOPICS.model, b"model 2")

    device.publish(TOPICS.status("kitchen-pi"), b"online")
    coordinator.until(TOPICS.status("kitchen-pi"), b"online")
    assert device.disconnects == listener.disconnects == 0


def test_a_device_cannot_write_for_another_or_read_its_task(broker, clients):
    coordinator = Client(broker.settings("coordinator", tls=False), (TOPICS.all_status, TOPICS.model))
    clients.append(coordinator.connected())
    coordinator.publish(TOPICS.task("hall-pi"), b"hall-pi's task", retain=True)
    coordinator.publish(TOPICS.task("kitchen-pi"), b"kitchen-pi's task", retain=True)
    hall = Client(broker.settings("hall-pi"), (TOPICS.task("hall-pi"),)).connected()
    clients.append(hall)
    hall.until(TOPICS.task("hall-pi"), b"hall-pi's task")

    kitchen = Client(broker.settings("kitchen-pi")).connected()
    clients.append(kitchen)
    kitchen.publish(TOPICS.status("hall-pi"), b"forged status")
    kitchen.publish(TOPICS.model, b"forged model")
    kitchen.publish(TOPICS.task("hall-pi"), b"forged task")
    kitchen.publish(TOPICS.status("kitchen-pi"), b"kitchen-pi's own status")
    seen = coordinator.until(TOPICS.status("kitchen-pi"), b"kitchen-pi's own status")
    assert seen == [(TOPICS.status("kitchen-pi"), b"kitchen-pi's own status")], "a forged message arrived"
    coordinator.publish(TOPICS.task("hall-pi"), b"hall-pi's next task")  # after the forged task, if any
    assert hall.until(TOPICS.task("hall-pi"), b"hall-pi's next task") == [
        (TOPICS.task("hall-pi"), b"hall-pi's next task")
    ], "a forged task arrived"

    # Subscriptions are granted, but only what kitchen-pi may read is delivered: retained or live.
    kitchen.subscribe(TOPICS.task("hall-pi"))
    kitchen.subscribe(f"{TOPICS.root}/#")
    kitchen.subscribe(TOPICS.task("kitchen-pi"))  # its retained task comes after anything the first two sent
    coordinator.publish(TOPICS.task("hall-pi"), b"hall-pi's third task")
    coordinator.publish(TOPICS.task("kitchen-pi"), b"kitchen-pi's next task")
    seen = kitchen.until(TOPICS.task("kitchen-pi"), b"kitchen-pi's next task")
    assert {topic for topic, _ in seen} == {TOPICS.task("kitchen-pi")}, "kitchen-pi read another's topic"


def test_a_device_cannot_take_another_devices_client_id(broker, clients):
    coordinator = Client(broker.settings("coordinator", tls=False), (TOPICS.all_status,)).connected()
    clients.append(coordinator)
    will = LastWill(TOPICS.status("kitchen-pi"), b"offline")
    kitchen = Client(broker.settings("kitchen-pi"), client_id="kitchen-pi", will=will).connected()
    clients.append(kitchen)

    impostor = Client(broker.settings("hall-pi"), client_id="kitchen-pi").connected()
    clients.append(impostor)
    # Had the impostor taken over kitchen-pi's session, kitchen-pi's will would have been published then,
    # before anything the impostor sends once connected.
    impostor.publish(TOPICS.status("kitchen-pi"), b"impostor")
    impostor.publish(TOPICS.status("hall-pi"), b"hall-pi")
    seen = coordinator.until(TOPICS.status("hall-pi"), b"hall-pi")
    assert seen == [(TOPICS.status("hall-pi"), b"hall-pi")], "a will fired, or the impostor is not hall-pi"
    kitchen.publish(TOPICS.status("kitchen-pi"), b"still here")
    assert coordinator.until(TOPICS.status("kitchen-pi"), b"still here") == [
        (TOPICS.status("kitchen-pi"), b"still here")
    ]
    assert kitchen.disconnects == 0, "the impostor disconnected kitchen-pi"


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
def test_anonymous_clients_and_wrong_passwords_are_refused(broker, clients, tls):
    wrong_password = broker.settings("kitchen-pi", tls, password_file=broker.password_file("hall-pi"))
    unknown_user = broker.settings("stranger", tls, password_file=broker.password_file("hall-pi"))
    for settings in (broker.settings(None, tls), wrong_password, unknown_user):
        client = Client(settings)
        clients.append(client)
        assert client.first_event().startswith("refused"), f"{settings.username} was let in"
    clients.append(Client(broker.settings("kitchen-pi", tls)).connected())


def test_tls_needs_the_fleet_ca(broker, tmp_path, clients):
    make_certs(tmp_path / "other-fleet")
    settings = broker.settings("kitchen-pi", ca_file=tmp_path / "other-fleet" / "ca.crt")
    with pytest.raises(ssl.SSLCertVerificationError):
        make_client(settings).connect(*settings.address)
    clients.append(Client(broker.settings("kitchen-pi")).connected())


def test_a_signed_message_fits_and_a_larger_packet_is_refused(broker, clients):
    coordinator = Client(broker.settings("coordinator", tls=False)).connected()
    clients.append(coordinator)
    device = Client(broker.settings("kitchen-pi"), (TOPICS.model, TOPICS.task("kitchen-pi"))).connected()
    clients.append(device)
    largest = signing.MAX_SIGNED_BYTES * b"x"
    assert signing.MAX_SIGNED_BYTES > MAX_MESSAGE_BYTES
    coordinator.publish(TOPICS.model, largest)
    coordinator.publish(TOPICS.task("kitchen-pi"), largest)
    device.until(TOPICS.model, largest)
    device.until(TOPICS.task("kitchen-pi"), largest)

    coordinator.paho.publish(TOPICS.model, 200_000 * b"x", qos=0)
    assert coordinator.first_event("the broker to refuse 200 kB") == "disconnected"
    coordinator.connected()  # paho reconnects by itself
    coordinator.publish(TOPICS.model, b"after")
    assert device.until(TOPICS.model, b"after") == [(TOPICS.model, b"after")], "the large packet arrived"


def test_a_required_device_certificate(broker_folder, tmp_path, clients):
    """The config's commented-out require_certificate works with make-certs.sh's device certificates."""
    config = shipped_config(broker_folder, free_port(), free_port())
    assert "\n#require_certificate true\n" in config
    config = config.replace("\n#require_certificate true\n", "\nrequire_certificate true\n")
    proc, broker = start_broker(broker_folder, config)
    make_certs(tmp_path / "other-fleet", "--device", "kitchen-pi")
    ours, others = broker.folder / "certs" / "devices", tmp_path / "other-fleet" / "devices"
    try:
        for certs, accepted in ((ours, True), (None, False), (others, False)):
            files = (
                {"cert_file": certs / "kitchen-pi.crt", "key_file": certs / "kitchen-pi.key"} if certs else {}
            )
            client = Client(broker.settings("kitchen-pi", **files))
            clients.append(client)
            # TLS 1.3: a refused client certificate shows after the handshake, as a lost connection
            assert (client.first_event() == "connected") == accepted, f"certificate from {certs}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        print(read_logs(broker))


def test_a_round_over_the_shipped_broker_and_https(broker, processes: Processes, tmp_path, clients):
    """The coordinator and a device, both over TLS with broker passwords, as DEVICES.md installs them."""
    port, certs = free_port(), broker.folder / "certs"
    url, broker_url = f"https://127.0.0.1:{port}", f"mqtts://127.0.0.1:{broker.tls_port}"
    https = ssl.create_default_context(cafile=broker.ca)

    def get(path: str):
        try:
            with urllib.request.urlopen(f"{url}{path}", context=https, timeout=5) as reply:
                return json.loads(reply.read())
        except OSError:
            return None

    def assert_alive() -> None:
        for proc in processes.procs:
            assert proc.poll() is None, f"{proc.log_path.name} exited"

    try:
        processes.start(
            "coordinator",
            "coordinator",
            "--broker", broker_url,
            "--broker-username", "coordinator",
            "--broker-password-file", str(broker.password_file("coordinator")),
            "--broker-ca", str(broker.ca),
            "--tls-cert", str(certs / "server.crt"),
            "--tls-key", str(certs / "server.key"),
            "--open-enrolment",
            "--rounds", "1",
            "--min-devices", "1",
            "--min-results", "1",
            "--state", str(tmp_path / "state"), "--new-state",
            "--port", str(port),
            "--topic-root", TOPICS.root,
        )  # fmt: skip
        wait_for(lambda: assert_alive() or get("/api/status"), 90, "the coordinator to serve HTTPS")
        processes.start(
            "client-jackson",
            "client",
            "--coordinator", url,
            "--coordinator-ca", str(broker.ca),
            "--broker", broker_url,
            "--broker-password-file", str(broker.password_file("jackson")),
            "--broker-ca", str(broker.ca),
            "--speaker", "jackson",
            "--max-samples", "40",
            "--state", str(tmp_path / "device"),
        )  # fmt: skip
        completed = lambda: assert_alive() or (get("/api/status") or {}).get("completed_round") == 1  # noqa: E731
        wait_for(completed, 240, "round 1 to complete")
        assert [d["device_id"] for d in get("/api/devices")] == ["jackson"]

        # The announcement the coordinator left on the broker is signed, and any device may read it: round
        # 0's, retained, then round 1's once its evaluation is over, if it was not there already
        reader = Client(broker.settings("kitchen-pi"), (TOPICS.model,)).connected()
        clients.append(reader)
        key = signing.parse_public_key(get("/api/key")["coordinator_key"])
        rounds = []
        while 1 not in rounds:
            topic, payload = reader.messages.get(timeout=WAIT_S)
            rounds.append(messages.decode(signing.verify(key, topic, payload), ModelAnnouncement).round)
        assert rounds in ([1], [0, 1])
        processes.stop_all()
        assert [p.returncode for p in processes.procs] == [0, 0], "both stop cleanly on SIGTERM"
    finally:
        for proc in processes.procs:
            print(f"---- {proc.log_path.name}\n{proc.log_path.read_text()[-5000:]}")
