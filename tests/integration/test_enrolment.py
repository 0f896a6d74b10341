"""No stranger steers the fleet: registration needs a device's token or enrolment secret, tasks are signed."""

import logging
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from fedspeech.coordinator.app import create_app
from fedspeech.coordinator.broker.mqtt_link import CoordinatorLink
from fedspeech.coordinator.fleet.enrolment import add_device, revoke_device
from fedspeech.edge_client import ClientConfig, DataSource, run_client
from fedspeech.edge_client.credentials import Refused
from fedspeech.protocol import messages, signing
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import (
    Credentials,
    DeviceStatus,
    ModelAnnouncement,
    Profile,
    Registration,
    Task,
)
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import Topics, parse_broker_url
from tests.helpers.configs import coordinator_config
from tests.helpers.coordinators import running_coordinator
from tests.helpers.devices import one_round_coordinator
from tests.helpers.waiting import wait_for


@pytest.fixture
def make_app(tmp_path, mosquitto_url):
    """A coordinator app (not started: HTTP through Flask's test client) with extra settings."""

    def make(**settings):
        return create_app(coordinator_config(tmp_path, broker=mosquitto_url, **settings))

    return make


def _register(http, device_id: str, credential: str | None = None):
    body = messages.encode(Registration(device_id, 20, Profile(2, 0.0, 512.0)))
    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
    return http.post("/api/devices", data=body, headers=headers)


def _token(reply) -> str:
    assert reply.status_code == 200, reply.get_json()
    return messages.decode(reply.data, Credentials).token


def _authorised(http, token: str) -> bool:
    """Whether an upload with this token gets past the token check (no round is open: 409, not 401)."""
    reply = http.post("/api/rounds/1/evaluations", data=b"{}", headers={"Authorization": f"Bearer {token}"})
    assert reply.status_code in (400, 401, 409)
    return reply.status_code != 401


def test_no_stranger_takes_over_a_registered_device(make_app, caplog):
    http = make_app(open_enrolment=True).test_client()
    token = _token(_register(http, "kitchen"))
    caplog.set_level(logging.WARNING)

    for credential in (None, "a-guess-at-the-token-of-the-kitchen"):
        reply = _register(http, "kitchen", credential)
        assert reply.status_code == 401
        assert "kitchen" in reply.get_json()["error"]
    refusals = [r for r in caplog.records if "rejected (401)" in r.getMessage()]
    assert len(refusals) == 2 and all(r.levelno == logging.WARNING for r in refusals)
    assert _authorised(http, token), "the device's own token still works"


def test_registering_again_with_the_token_replaces_it(make_app, caplog):
    http = make_app(open_enrolment=True).test_client()
    first = _token(_register(http, "kitchen"))
    caplog.set_level(logging.WARNING)
    second = _token(_register(http, "kitchen", first))
    assert second != first
    assert not _authorised(http, first), "the old token no longer works"
    assert _authorised(http, second)
    assert any(
        r.levelno == logging.WARNING and "kitchen registered again" in r.getMessage() for r in caplog.records
    )


def test_enrolment_with_a_secret(make_app):
    app = make_app()  # enrolment closed: the default
    http, store = app.test_client(), app.extensions["fedspeech"].store
    secret = add_device(store, "hall")
    with pytest.raises(ValueError, match="already known"):
        add_device(store, "hall")
    with pytest.raises(ValueError, match="bad device id"):
        add_device(store, "../etc")

    stranger = _register(http, "stranger")
    assert stranger.status_code == 401 and "not enrolled" in stranger.get_json()["error"]
    assert _register(http, "hall").status_code == 401
    assert _register(http, "hall", secret[:-2] + "xx").status_code == 401
    token = _token(_register(http, "hall", secret))
    assert _authorised(http, token)
    again = _token(_register(http, "hall", secret))  # the secret still enrols it, if the token is lost
    assert not _authorised(http, token) and _authorised(http, again)

    assert revoke_device(store, "hall") and not revoke_device(store, "hall")
    assert not _authorised(http, again), "a revoked device's token gets 401"
    assert _register(http, "hall", secret).status_code == 401, "and it must be enrolled again"


def test_open_enrolment_takes_new_devices_up_to_the_cap(make_app):
    http = make_app(open_enrolment=True, max_devices=3).test_client()
    tokens = [_token(_register(http, f"d{i}")) for i in range(3)]
    full = _register(http, "d3")
    assert full.status_code == 403 and "maximum of 3 devices" in full.get_json()["error"]
    assert _token(_register(http, "d0", tokens[0])), "known devices still register again"


def test_the_coordinator_names_its_signing_key(make_app, tmp_path):
    app = make_app(open_enrolment=True)
    http = app.test_client()
    key = signing.load_or_create_key(tmp_path / "state" / "coordinator.key")
    public = signing.public_key_text(key)
    assert http.get("/api/key").get_json() == {"coordinator_key": public}
    assert messages.decode(_register(http, "kitchen").data, Credentials).coordinator_key == public
    assert (tmp_path / "state" / "coordinator.pub").read_text().strip() == public
    assert (tmp_path / "state" / "coordinator.key").stat().st_mode & 0o777 == 0o600
    assert signing.public_key_text(make_app().extensions["fedspeech"].key) == public, "kept across restarts"


class _Listener:
    """A paho client on the real broker keeping the raw payloads of the topics it subscribed to."""

    def __init__(self, broker_url: str, *topics: str) -> None:
        self.payloads: dict[str, list[bytes]] = {t: [] for t in topics}
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        self.client.on_connect = lambda c, *_: [c.subscribe(t, qos=1) for t in topics]
        self.client.on_message = lambda c, u, m: m.payload and self.payloads[m.topic].append(bytes(m.payload))
        self.client.connect(*parse_broker_url(broker_url))
        self.client.loop_start()

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def test_tasks_and_announcements_arrive_signed(tmp_path, mosquitto_url, topic_root):
    with one_round_coordinator(tmp_path, mosquitto_url, topic_root, "kitchen", eval_every=0) as running:
        app, service, device = running
        topics = Topics(topic_root)
        listener = _Listener(mosquitto_url, topics.task("kitchen"), topics.model)
        try:
            http = app.test_client()
            key = signing.parse_public_key(http.get("/api/key").get_json()["coordinator_key"])
            _token(_register(http, "kitchen"))
            device.go_online(20)
            task_payloads = wait_for(lambda: listener.payloads[topics.task("kitchen")], 120, "a task")
            announcements = wait_for(lambda: listener.payloads[topics.model], 120, "an announcement")
        finally:
            listener.close()
    task = messages.decode(signing.verify(key, topics.task("kitchen"), task_payloads[0]), Task)
    assert task.round == 1
    announced = messages.decode(signing.verify(key, topics.model, announcements[0]), ModelAnnouncement)
    assert announced.round == 0
    with pytest.raises(ProtocolError, match="bad signature"):
        signing.verify(key, topics.task("another-device"), task_payloads[0])  # no replay onto another topic
    with pytest.raises(ProtocolError):
        messages.decode(task_payloads[0], Task)  # never a bare task


def test_statuses_from_strangers_on_the_broker_are_bounded(tmp_path, mosquitto_url, topic_root, caplog):
    topics = Topics(topic_root)
    key = signing.load_or_create_key(tmp_path / "coordinator.key")
    link = CoordinatorLink(BrokerSettings(mosquitto_url), topics, key, max_tracked=4, max_offline=2)
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    publisher.connect(*parse_broker_url(mosquitto_url))
    publisher.loop_start()
    link.start()

    def status(device_id: str, state: str) -> None:
        payload = messages.encode(DeviceStatus(device_id, state))
        publisher.publish(topics.status(device_id), payload, qos=1).wait_for_publish(5)

    try:
        wait_for(lambda: status("probe", "online") or "probe" in link.statuses(), 10, "the link to listen")
        publisher.publish(topics.status("probe"), b"", qos=1).wait_for_publish(5)  # a cleared status
        wait_for(lambda: not link.statuses(), 10, "the cleared device forgotten")
        for i in range(3):
            status(f"gone-{i}", "offline")
        wait_for(lambda: "gone-2" in link.statuses(), 10, "the statuses to arrive")
        assert set(link.statuses()) == {"gone-1", "gone-2"}, "the longest offline forgotten"
        for i in range(4):
            status(f"up-{i}", "online")
        wait_for(lambda: "up-3" in link.statuses(), 10, "the statuses to arrive")
        assert link.online() == [f"up-{i}" for i in range(4)], "offline devices made room for online ones"
        caplog.set_level(logging.WARNING)
        status("up-4", "online")
        wait_for(lambda: "statuses of further devices are ignored" in caplog.text, 10, "the cap logged")
        status("up-5", "online")
        time.sleep(0.5)
        assert set(link.statuses()) == {f"up-{i}" for i in range(4)}
        assert caplog.text.count("statuses of further devices are ignored") == 1, "logged once"
    finally:
        link.stop()
        publisher.loop_stop()
        publisher.disconnect()


def test_a_device_going_offline_and_back_is_logged_and_a_flipping_status_a_few_times_a_minute(
    tmp_path, mosquitto_url, topic_root, caplog
):
    from fedspeech.coordinator.broker import mqtt_link

    topics = Topics(topic_root)
    link = CoordinatorLink(BrokerSettings(mosquitto_url), topics, signing.load_or_create_key(tmp_path / "k"))
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    publisher.connect(*parse_broker_url(mosquitto_url))
    publisher.loop_start()
    link.start()
    caplog.set_level(logging.INFO, "fedspeech.coordinator.broker.mqtt_link")

    def status(state: str) -> None:
        payload = messages.encode(DeviceStatus("kitchen", state))
        publisher.publish(topics.status("kitchen"), payload, qos=1, retain=True).wait_for_publish(5)
        wait_for(
            lambda: link.statuses().get("kitchen", DeviceStatus("kitchen", "")).state == state, 10, state
        )

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("device kitchen ")]

    try:
        status("online")  # retained, as a device's status is: the link hears it once it has subscribed
        assert said() == [], "a device first heard of is not news"
        status("offline")
        status("training")
        assert said() == ["device kitchen went offline", "device kitchen is back online"]
        for state in ("offline", "online") * 5:  # a forger flipping it: logged a few times a minute
            status(state)
        assert len(said()) == mqtt_link.TURN_LOG_MOST
    finally:
        publisher.publish(topics.status("kitchen"), b"", qos=1, retain=True).wait_for_publish(5)
        link.stop()
        publisher.loop_stop()
        publisher.disconnect()


def test_only_registered_devices_count_as_online(tmp_path, mosquitto_url, topic_root):
    with one_round_coordinator(tmp_path, mosquitto_url, topic_root, "kitchen", eval_every=0) as running:
        app, service, device = running
        http = app.test_client()
        device.go_online(20)  # its status is on the broker, but it never registered
        wait_for(lambda: "kitchen" in service.link.online(), 10, "the status to arrive")
        assert http.get("/api/status").get_json()["devices_online"] == []
        _token(_register(http, "kitchen"))
        assert http.get("/api/status").get_json()["devices_online"] == ["kitchen"]


def test_a_refused_enrolment_secret_is_named_as_the_cause(tmp_path, mosquitto_url, topic_root):
    settings = {"broker": mosquitto_url, "topic_root": topic_root, "open_enrolment": False}
    with running_coordinator(tmp_path, **settings, eval_corpus=None, rounds=1) as (service, url):
        add_device(service.store, "hall")
        secret_file = tmp_path / "hall.secret"
        secret_file.write_text("a-secret-of-another-device-0123\n")
        for device_id in ("hall", "attic"):  # a wrong secret, and an id the coordinator never enrolled
            config = ClientConfig(
                coordinator_url=url,
                broker=BrokerSettings(mosquitto_url),
                device_id=device_id,
                data=DataSource(corpus="fsdd", speaker="jackson"),
                state_dir=tmp_path / device_id,
                topic_root=topic_root,
                max_samples=8,
                enrolment_secret=secret_file.read_text().strip(),
                enrolment_secret_file=secret_file,
            )
            with pytest.raises(Refused) as refused:
                run_client(config, threading.Event())
            assert str(refused.value) == (
                f"the coordinator at {url} refused to register {device_id} with its enrolment secret (from "
                f"{secret_file}): the secret is wrong, or {device_id} is not enrolled there. On the "
                f"coordinator, `fedspeech devices add {device_id}` prints a new one (`fedspeech devices "
                f"revoke {device_id}` first if it is enrolled already)"
            )
        assert service.store.device("hall").registered is False, "nothing changed on the coordinator"


def test_two_devices_with_one_id_are_named_and_a_replaced_state_folder_is_not(make_app, caplog, monkeypatch):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedspeech.coordinator.fleet import enrolment

    app = make_app()
    http, store = app.test_client(), app.extensions["fedspeech"].store
    secret = add_device(store, "hall")
    first, second = (signing.public_key_text(Ed25519PrivateKey.generate()) for _ in range(2))

    def register(identity: str) -> str:
        body = messages.encode(Registration("hall", 20, Profile(2, 0.0, 512.0), {}, identity))
        return _token(http.post("/api/devices", data=body, headers={"Authorization": f"Bearer {secret}"}))

    def shared() -> bool:
        (hall,) = http.get("/api/devices").get_json()
        return hall["shared_id"]

    caplog.set_level(logging.WARNING, "fedspeech.coordinator.fleet.enrolment")
    register(first)
    register(first)  # the same device again (a restart): nothing to say
    assert not shared() and "two devices" not in caplog.text
    for identity in (second, first, second):  # two devices with the id, each taking the other's token in turn
        register(identity)
    named = [r.getMessage() for r in caplog.records if "two devices run with the id hall" in r.getMessage()]
    assert len(named) == 3 and "give each its own --device-id" in named[0], named
    assert shared()

    caplog.clear()
    monkeypatch.setattr(enrolment, "SHARED_ID_S", 0.0)  # long after: a device whose state folder was replaced
    register(first)
    assert "two devices" not in caplog.text and not shared()
