"""The README's first deployment: Mosquitto run with `fedspeech broker-config`'s files, and nothing else.

A stranger without credentials is refused, so cannot forge a status (a device's weight), a task or a
model, nor take a device's client id to disconnect it; an enrolled device gets working broker credentials
when it registers over HTTP, and loses them when it is revoked and Mosquitto reloads. Negative checks
never sleep (tests/helpers/mqtt_clients).
"""

import logging
import os
import pwd
import shlex
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedspeech.coordinator.app import create_app, serve
from fedspeech.coordinator.broker import broker_users
from fedspeech.coordinator.fleet.enrolment import add_device, revoke_device
from fedspeech.coordinator.state.store import Store
from fedspeech.edge_client.coordinator_http import CoordinatorClient
from fedspeech.edge_client.credentials import DeviceCredentials
from fedspeech.edge_client.mqtt_link import BrokerLink
from fedspeech.protocol.messages import DeviceStatus, Profile
from fedspeech.protocol.mqtt import BrokerSettings, LastWill, connect, make_client
from fedspeech.protocol.topics import Topics
from fedspeech_bench.attacks.mosquitto import Mosquitto, listening, running_mosquitto
from tests.helpers.configs import coordinator_config
from tests.helpers.mqtt_clients import WAIT_S, Client
from tests.helpers.ports import free_port
from tests.helpers.readme import own_devices_blocks
from tests.helpers.waiting import wait_for

TOPICS = Topics("test/generated-broker")
DEVICES = ["kitchen-pi", "hall-pi"]

pytestmark = pytest.mark.timeout(120)


@dataclass
class Fleet:
    """The coordinator's state with enrolled devices, and Mosquitto running its generated config."""

    state: Path
    secrets: dict[str, str]
    url: str
    mosquitto: Mosquitto

    def settings(self, user: str | None = None, password_of: str | None = None) -> BrokerSettings:
        """Logging in as user with the password of password_of (default: user's own); None: anonymous."""
        if user is None:
            return BrokerSettings(self.url)
        owner = password_of or user
        folder = self.state / "broker"
        password_file = folder / f"{owner}.password"
        if not password_file.exists():
            password_file = folder / "devices" / f"{owner}.password"
        return BrokerSettings(self.url, user, password_file)


@pytest.fixture
def fleet(tmp_path) -> Iterator[Fleet]:
    """Two enrolled devices, then `fedspeech broker-config`'s files, then Mosquitto with them."""
    state, port = tmp_path / "state", free_port()
    store = Store(state)
    secrets = {device_id: add_device(store, device_id) for device_id in DEVICES}
    config = broker_users.write_config(state, "127.0.0.1", port, TOPICS.root, DEVICES)
    with running_mosquitto(config, port) as mosquitto:
        yield Fleet(state, secrets, f"mqtt://127.0.0.1:{port}", mosquitto)


def test_a_client_without_credentials_is_refused(fleet, clients):
    stranger = fleet.settings("stranger", password_of="kitchen-pi")
    for settings in (fleet.settings(), fleet.settings("kitchen-pi", password_of="hall-pi"), stranger):
        client = Client(settings, client_id=f"{TOPICS.root}/kitchen-pi")
        clients.append(client)
        assert client.first_event().startswith("refused"), f"{settings.username} was let in"
    clients.append(Client(fleet.settings("kitchen-pi")).connected())


def test_a_device_writes_only_its_own_status_and_reads_only_its_task_and_the_model(fleet, clients):
    coordinator = Client(fleet.settings("coordinator"), (TOPICS.all_status,)).connected()
    clients.append(coordinator)
    coordinator.publish(TOPICS.model, b"model 1", retain=True)
    coordinator.publish(TOPICS.task("hall-pi"), b"hall-pi's task", retain=True)
    coordinator.publish(TOPICS.task("kitchen-pi"), b"kitchen-pi's task", retain=True)

    watched = (TOPICS.model, TOPICS.task("kitchen-pi"), TOPICS.task("hall-pi"), f"{TOPICS.root}/#")
    kitchen = Client(fleet.settings("kitchen-pi"), watched).connected()
    clients.append(kitchen)
    # a forged status would set hall-pi's weight in the next round; a forged task or model steer it
    kitchen.publish(TOPICS.status("hall-pi"), b'{"num_samples": 1}')
    kitchen.publish(TOPICS.task("hall-pi"), b"forged task")
    kitchen.publish(TOPICS.model, b"forged model")
    kitchen.publish(TOPICS.status("kitchen-pi"), b"kitchen-pi's own status")
    seen = coordinator.until(TOPICS.status("kitchen-pi"), b"kitchen-pi's own status")
    assert seen == [(TOPICS.status("kitchen-pi"), b"kitchen-pi's own status")], "a forged status arrived"

    coordinator.publish(TOPICS.model, b"model 2", retain=True)
    seen = kitchen.until(TOPICS.model, b"model 2")
    assert {topic for topic, _ in seen} == {TOPICS.model, TOPICS.task("kitchen-pi")}, "read another's topic"
    assert (TOPICS.task("kitchen-pi"), b"kitchen-pi's task") in seen
    assert (TOPICS.model, b"forged model") not in seen and (TOPICS.model, b"model 1") in seen

    listener = Client(fleet.settings("kitchen-pi-listen"), (TOPICS.model,)).connected()
    clients.append(listener)
    assert listener.until(TOPICS.model, b"model 2") == [(TOPICS.model, b"model 2")]


def test_no_client_without_credentials_takes_a_devices_client_id(fleet, clients):
    coordinator = Client(fleet.settings("coordinator"), (TOPICS.all_status,)).connected()
    clients.append(coordinator)
    will = LastWill(TOPICS.status("kitchen-pi"), b"offline")
    client_id = f"{TOPICS.root}/kitchen-pi"  # the id edge_client.mqtt_link asks for
    kitchen = Client(fleet.settings("kitchen-pi"), client_id=client_id, will=will).connected()
    clients.append(kitchen)

    impostors = [fleet.settings(), fleet.settings("kitchen-pi", password_of="hall-pi")]
    for settings in impostors:
        for taken in (client_id, "kitchen-pi"):
            impostor = Client(settings, client_id=taken)
            clients.append(impostor)
            assert impostor.first_event().startswith("refused")
    # an enrolled device asking for kitchen-pi's id gets its own user name as its id instead
    clients.append(Client(fleet.settings("hall-pi"), client_id=client_id).connected())
    # Had an impostor ended kitchen-pi's session, its will would have been published before this.
    kitchen.publish(TOPICS.status("kitchen-pi"), b"still here")
    seen = coordinator.until(TOPICS.status("kitchen-pi"), b"still here")
    assert seen == [(TOPICS.status("kitchen-pi"), b"still here")], "kitchen-pi's will was published"
    assert kitchen.disconnects == 0, "an impostor disconnected kitchen-pi"


def test_a_device_enrolled_before_mosquitto_reloads_is_told_what_to_do(fleet, clients, caplog):
    add_device(Store(fleet.state), "garage-pi")  # its broker password is written; Mosquitto has not read it
    settings = fleet.settings("garage-pi")
    paho = make_client(settings, "garage-pi")  # as a device's or coordinator's, which says why it is refused
    with caplog.at_level(logging.WARNING, "fedspeech.protocol.mqtt"):
        connect(paho, settings)
        try:
            wait_for(lambda: "refused the connection" in caplog.text, 10, "the refusal")
        finally:
            paho.disconnect()
            paho.loop_stop()
    said = [r.getMessage() for r in caplog.records if "refused the connection" in r.getMessage()]
    assert said and "(user garage-pi)" in said[0] and "kill -HUP $(cat STATE/broker/mosquitto.pid)" in said[0]
    fleet.mosquitto.reload()
    wait_for(lambda: "Reloading config" in fleet.mosquitto.log(), 10, "the reload")
    clients.append(Client(fleet.settings("garage-pi")).connected())


def test_a_coordinator_on_a_new_state_refused_by_the_old_states_broker_is_told_what_to_do(
    fleet, processes, tmp_path
):
    """A new state folder (the old one lost, or a typo given --new-state) has no broker password yet."""
    fresh = tmp_path / "fresh"
    coordinator = processes.start(
        "coordinator", "coordinator", "--state", str(fresh), "--new-state", "--broker", fleet.url,
        "--topic-root", TOPICS.root, "--port", "0",
    )  # fmt: skip
    wait_for(lambda: "refused the connection" in coordinator.log_path.read_text(), 120, "the refusal")
    said = next(
        line for line in coordinator.log_path.read_text().splitlines() if "refused the connection" in line
    )
    assert f"broker {fleet.url} refused the connection: Not authorized (user (none))" in said
    assert "a new coordinator state needs `fedspeech broker-config` first" in said
    assert coordinator.poll() is None, "a service waits for its broker"


def test_a_revoked_device_is_refused_once_mosquitto_reloads(fleet, clients):
    kitchen = Client(fleet.settings("kitchen-pi")).connected()
    clients.append(kitchen)
    password = fleet.settings("kitchen-pi").password_file.read_text()  # kept by the device, in truth
    kept = fleet.state.parent / "kitchen-pi.password"
    kept.write_text(password)

    assert revoke_device(Store(fleet.state), "kitchen-pi")
    users = {line.split(":")[0] for line in (fleet.state / "broker" / "passwd").read_text().splitlines()}
    assert users == {"coordinator", "homeassistant", "hall-pi", "hall-pi-listen"}
    fleet.mosquitto.reload()
    # Mosquitto checks its clients again on reload: the revoked device's session ends there and then
    assert kitchen.first_event("the revoked device to be disconnected") == "disconnected"
    again = Client(BrokerSettings(fleet.url, "kitchen-pi", kept))
    clients.append(again)
    assert again.first_event().startswith("refused")
    clients.append(Client(fleet.settings("hall-pi")).connected())


def test_a_registration_over_http_hands_out_working_broker_credentials(fleet, tmp_path):
    config = coordinator_config(tmp_path, state=fleet.state, broker=fleet.url, topic_root=TOPICS.root)
    app = create_app(config)
    service = app.extensions["fedspeech"]
    assert service.link.settings.username == "coordinator"  # from the state, with no option given
    service.link.start()  # the API and the MQTT link, without a round loop
    server = serve(app, "127.0.0.1", 0)
    stop = threading.Event()
    link = None
    try:
        credentials = DeviceCredentials(tmp_path / "device" / "kitchen-pi")
        http = CoordinatorClient(server.url, "kitchen-pi", stop, credentials, fleet.secrets["kitchen-pi"])
        assert http.register(40, Profile(2, 1000.0, 512.0))
        for name in ("broker-password", "listen-password"):
            assert stat.S_IMODE(os.stat(credentials.folder / name).st_mode) == 0o600

        settings = credentials.broker_login(BrokerSettings(fleet.url), "kitchen-pi")
        assert settings.username == "kitchen-pi"
        assert credentials.key is not None
        link = BrokerLink(settings, TOPICS, "kitchen-pi", credentials.key)
        link.start(DeviceStatus("kitchen-pi", "online", 40))
        wait_for(lambda: "kitchen-pi" in service.link.online(), WAIT_S, "the coordinator to see kitchen-pi")
        listener = BrokerSettings(fleet.url, "kitchen-pi-listen", credentials.folder / "listen-password")
        Client(listener).connected().close()
    finally:
        stop.set()
        if link is not None:
            link.go_offline()
        server.stop()
        service.link.stop()


@pytest.mark.parametrize("in_background", [True, False])
def test_the_readmes_broker_line_runs_as_written(tmp_path, in_background):
    """As root too (as on a Pi's first setup, or in a container): Mosquitto stays the state folder's owner,
    who may read it, instead of becoming user mosquitto, who may not; with -d and in the foreground."""
    setup = own_devices_blocks()[1]
    (line,) = [line for line in setup if "mosquitto -c" in line]
    argv = shlex.split(line)
    assert argv[-1] == "-d", line
    port = free_port()
    fedspeech = [sys.executable, "-m", "fedspeech"]
    enrol = [*fedspeech, "devices", "add", "kitchen-pi", "--new-state", "--secret-file", "kitchen-pi.secret"]
    subprocess.run(enrol, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    made = [*fedspeech, "broker-config", "--port", str(port)]
    subprocess.run(made, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    state = tmp_path / "fedspeech-state"
    assert f"user {pwd.getpwuid(os.geteuid()).pw_name}\n" in (state / "broker" / "mosquitto.conf").read_text()

    foreground = None
    if in_background:
        started = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert started.returncode == 0, started.stderr
    else:
        foreground = subprocess.Popen(
            argv[:-1], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
    try:
        wait_for(lambda: listening(port), 10, f"Mosquitto on port {port}")
        coordinator = BrokerSettings(
            f"mqtt://127.0.0.1:{port}", "coordinator", broker_users.coordinator_password_file(state)
        )
        client = Client(coordinator).connected()  # it read its password file, in the 0700 folder
        client.close()
        pid = int((state / "broker" / "mosquitto.pid").read_text())  # the README's `kill -HUP $(cat ...)`
        os.kill(pid, signal.SIGHUP)
        wait_for(lambda: "Reloading config" in (state / "broker" / "mosquitto.log").read_text(), 10, "reload")
    finally:
        pid_file = state / "broker" / "mosquitto.pid"
        if foreground is not None:
            foreground.terminate()
            foreground.wait(timeout=10)
        elif pid_file.is_file():
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
