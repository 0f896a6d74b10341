"""Detections over MQTT, on a real Mosquitto with real paho clients: a listener hearing held-out FSDD digits
publishes one event per word, in order, with its Home Assistant discovery config and availability (its last
will says offline when it dies); and with the ACL `fedspeech broker-config` writes, a device's listener
writes its own detections only, which Home Assistant's user reads.

Negative checks never sleep (tests/helpers/mqtt_clients): each ends with a message that can only arrive
after the forbidden one would have.
"""

import json
import queue
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from fedspeech.coordinator.broker import broker_users
from fedspeech.coordinator.fleet.enrolment import add_device
from fedspeech.coordinator.state.store import Store
from fedspeech.protocol.mqtt import BrokerSettings, connect, make_client
from fedspeech.protocol.topics import DEFAULT_DISCOVERY_PREFIX, Topics, event_discovery, listen_user
from fedspeech.runtime.detection_events import DetectionPublisher, publisher_will
from fedspeech.runtime.listener import Listener
from fedspeech.runtime.session import OnnxModel
from fedspeech.runtime.streaming import Detection
from fedspeech_bench.attacks.mosquitto import running_mosquitto
from tests.helpers.mqtt_clients import WAIT_S, Client
from tests.helpers.onnx_files import with_metadata
from tests.helpers.ports import free_port
from tests.helpers.recordings import held_out_digits

RATE, PAUSE_S = 8000, 0.6
NAME = listen_user("kitchen-pi")

pytestmark = pytest.mark.timeout(180)


def take(digits: list[int], speaker: str = "lucas", number: int = 1) -> np.ndarray:
    """A speaker's held-out recordings (FSDD's 0-4) of these digits, PAUSE_S apart and around."""
    return held_out_digits(digits, speaker, number, PAUSE_S)[0]


def until_on(client: Client, topic: str) -> list[tuple[str, bytes]]:
    """Every message client receives up to and including the next one on topic."""
    received: list[tuple[str, bytes]] = []
    while not received or received[-1][0] != topic:
        try:
            received.append(client.messages.get(timeout=WAIT_S))
        except queue.Empty:
            pytest.fail(f"nothing arrived on {topic}; before: {[(t, p[:40]) for t, p in received]}")
    return received


def next_on(client: Client, topic: str) -> bytes:
    """The payload of the next message client receives on topic (others before it are skipped)."""
    return until_on(client, topic)[-1][1]


class Words:
    """What a publisher reads of a model: its labels, and how they are said."""

    def __init__(self, labels: list[str]) -> None:
        self.labels = labels

    def spoken(self, label: str) -> str:
        return label


def started(settings: BrokerSettings, name: str, topics: Topics, prefix: str | None) -> DetectionPublisher:
    """A publisher on a client of its own, as `fedspeech listen --publish` makes it, connecting."""
    client = make_client(settings, "", publisher_will(name, topics))
    publisher = DetectionPublisher(client, name, topics, prefix)
    publisher.attach()
    connect(client, settings)
    return publisher


def stopped(publisher: DetectionPublisher) -> None:
    """Say offline and disconnect."""
    publisher.close()
    publisher.client.disconnect()
    publisher.client.loop_stop()


def clear_retained(url: str, *topics: str) -> None:
    """Remove what the shared broker retains on topics."""
    client = Client(BrokerSettings(url)).connected()
    for topic in topics:
        client.publish(topic, b"", retain=True)
    client.close()


@pytest.fixture
def prefix(topic_root) -> str:
    """A discovery prefix of the test's own on the shared broker."""
    return f"{topic_root}/homeassistant"


@pytest.fixture
def publisher(mosquitto_url, topic_root, prefix) -> Iterator[DetectionPublisher]:
    """The listener's publisher on the machine's Mosquitto; its retained messages cleared at the end."""
    topics = Topics(topic_root)
    running = started(BrokerSettings(mosquitto_url), NAME, topics, prefix)
    yield running
    stopped(running)
    clear_retained(mosquitto_url, topics.availability(NAME), event_discovery(prefix, NAME))


def test_each_word_heard_arrives_as_an_event_in_order_with_discovery_and_availability(
    fsdd_model, publisher, mosquitto_url, topic_root, prefix, clients
):
    topics = Topics(topic_root)
    watcher = Client(BrokerSettings(mosquitto_url), (topics.all_listeners, f"{prefix}/#")).connected()
    clients.append(watcher)
    assert next_on(watcher, topics.availability(NAME)) == b"online"
    listener = Listener(
        fsdd_model.onnx_path, on_detection=publisher.on_detection, on_model=publisher.on_model
    )  # on_model: the first model's discovery config
    config = json.loads(next_on(watcher, event_discovery(prefix, NAME)))
    assert config["event_types"] == [str(digit) for digit in range(10)]  # never _none_
    assert config["state_topic"] == topics.detections(NAME)
    assert config["availability"][0]["topic"] == topics.availability(NAME)

    spoken = [3, 1, 4, 1, 5, 9, 2, 6]
    audio = take(spoken)
    heard: list[Detection] = []
    for start in range(0, len(audio), 1600):  # 200 ms blocks, as a microphone gives them
        heard += listener.feed(audio[start : start + 1600])
    heard += listener.flush()
    assert [d.label for d in heard] == [str(digit) for digit in spoken], "the model misheard the take"

    events = [json.loads(next_on(watcher, topics.detections(NAME))) for _ in heard]
    assert [event["event_type"] for event in events] == [d.label for d in heard]
    for event, detection in zip(events, heard, strict=True):
        assert event["label"] == detection.label and event["spoken"] == listener.model.spoken(detection.label)
        assert event["confidence"] == round(detection.confidence, 4) >= listener.detector.threshold
        assert event["stream_time_s"] == round(detection.time_s, 3) and event["model_round"] == 1
        assert event["listener"] == NAME and event["time"].endswith("Z") and event["epoch_s"] > 1.7e9
    assert [e["epoch_s"] for e in events] == sorted(e["epoch_s"] for e in events)

    # what Home Assistant finds when it subscribes later: the config and "online", retained
    late = Client(BrokerSettings(mosquitto_url), (f"{prefix}/#", topics.availability(NAME))).connected()
    clients.append(late)
    retained = dict(until_on(late, topics.availability(NAME)))  # Mosquitto answers subscriptions in order
    assert json.loads(retained[event_discovery(prefix, NAME)]) == config
    assert retained[topics.availability(NAME)] == b"online"


def test_discovery_is_republished_for_other_words_and_on_each_reconnection(
    fsdd_model, publisher, mosquitto_url, topic_root, prefix, clients, tmp_path
):
    topics = Topics(topic_root)
    watcher = Client(BrokerSettings(mosquitto_url), (topics.all_listeners, f"{prefix}/#")).connected()
    clients.append(watcher)
    assert next_on(watcher, topics.availability(NAME)) == b"online"
    model = OnnxModel(fsdd_model.onnx_path)
    publisher.on_model(model)
    assert json.loads(next_on(watcher, event_discovery(prefix, NAME)))["event_types"][:2] == ["0", "1"]

    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "_none_"]
    renamed = OnnxModel(with_metadata(fsdd_model.onnx_path, tmp_path / "words.onnx", words))
    publisher.on_model(OnnxModel(fsdd_model.onnx_path))  # the next round, the same words: no new config
    publisher.on_model(renamed)
    assert json.loads(next_on(watcher, event_discovery(prefix, NAME)))["event_types"] == words[:10]
    publisher.on_detection(Detection("three", 0.9, 1.5, 2))
    event = json.loads(next_on(watcher, topics.detections(NAME)))
    assert (event["event_type"], event["model_round"]) == ("three", 2)  # after its config, never before

    # the connection breaks: the broker says offline (the will); paho reconnects and says it all again
    publisher.client.socket().shutdown(socket.SHUT_RDWR)
    assert next_on(watcher, topics.availability(NAME)) == b"offline"
    assert json.loads(next_on(watcher, event_discovery(prefix, NAME)))["event_types"] == words[:10]
    assert next_on(watcher, topics.availability(NAME)) == b"online"


PUBLISHING = """
import sys, time
from fedspeech.protocol.mqtt import BrokerSettings, add_on_connect, connect, make_client
from fedspeech.protocol.topics import Topics
from fedspeech.runtime.detection_events import DetectionPublisher, publisher_will

url, root, name, prefix = sys.argv[1:]
settings, topics = BrokerSettings(url), Topics(root)
client = make_client(settings, "", publisher_will(name, topics))
DetectionPublisher(client, name, topics, prefix).attach()
add_on_connect(client, lambda client: print("connected", flush=True))
connect(client, settings)
time.sleep(600)
"""


def test_the_last_will_says_offline_when_the_listener_dies_and_closing_says_it_too(
    mosquitto_url, topic_root, prefix, clients
):
    topics = Topics(topic_root)
    watcher = Client(BrokerSettings(mosquitto_url), (topics.availability(NAME),)).connected()
    clients.append(watcher)
    args = [sys.executable, "-c", PUBLISHING, mosquitto_url, topic_root, NAME, prefix]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "connected\n"
        assert next_on(watcher, topics.availability(NAME)) == b"online"
        proc.kill()  # no DISCONNECT: the broker publishes the will
        proc.wait(timeout=10)
        assert next_on(watcher, topics.availability(NAME)) == b"offline"
    finally:
        proc.kill()
        proc.wait(timeout=10)
    late = Client(BrokerSettings(mosquitto_url), (topics.availability(NAME),)).connected()
    clients.append(late)
    assert next_on(late, topics.availability(NAME)) == b"offline"  # retained

    publisher = started(BrokerSettings(mosquitto_url), NAME, topics, prefix)
    assert next_on(watcher, topics.availability(NAME)) == b"online"
    stopped(publisher)  # a clean stop sends no will: close says offline itself
    assert next_on(watcher, topics.availability(NAME)) == b"offline"
    clear_retained(mosquitto_url, topics.availability(NAME), event_discovery(prefix, NAME))


# ---- with the ACL `fedspeech broker-config` writes ----

ROOT = "test/detections"
FLEET = Topics(ROOT)


@pytest.fixture
def fleet(tmp_path) -> Iterator[Callable[[str], BrokerSettings]]:
    """Two enrolled devices, `fedspeech broker-config`'s files and Mosquitto running them: how a user of
    theirs logs in (with the password broker-config made for it).
    """
    state, port = tmp_path / "state", free_port()
    devices = ["kitchen-pi", "hall-pi"]
    store = Store(state)
    for device_id in devices:
        add_device(store, device_id)
    config = broker_users.write_config(state, "127.0.0.1", port, ROOT, devices)

    def login(user: str) -> BrokerSettings:
        password_file = state / "broker" / f"{user}.password"
        if not password_file.exists():
            password_file = state / "broker" / "devices" / f"{user}.password"
        return BrokerSettings(f"mqtt://127.0.0.1:{port}", user, password_file)

    with running_mosquitto(config, port):
        yield login


def test_a_listener_publishes_its_own_detections_only_and_home_assistant_reads_them(fleet, clients):
    kitchen, hall = listen_user("kitchen-pi"), listen_user("hall-pi")
    discovery = {name: event_discovery(DEFAULT_DISCOVERY_PREFIX, name) for name in (kitchen, hall)}
    home_assistant = Client(fleet("homeassistant"), (FLEET.all_listeners, f"{DEFAULT_DISCOVERY_PREFIX}/#"))
    home_assistant.connected()

    publisher = started(fleet(kitchen), kitchen, FLEET, DEFAULT_DISCOVERY_PREFIX)
    try:
        assert next_on(home_assistant, FLEET.availability(kitchen)) == b"online"  # its will was allowed too
        publisher.on_model(Words(["yes", "no", "_none_"]))
        assert json.loads(next_on(home_assistant, discovery[kitchen]))["event_types"] == ["yes", "no"]

        # kitchen-pi's listener, writing as hall-pi's: a forged word, availability and discovery config
        forged = {
            FLEET.detections(hall): json.dumps({"event_type": "yes", "label": "yes"}),
            FLEET.availability(hall): "offline",
            discovery[hall]: json.dumps({"name": "forged", "event_types": ["yes"]}),
        }
        for topic, payload in forged.items():
            publisher.client.publish(topic, payload, qos=1, retain=True).wait_for_publish(WAIT_S)
        publisher.on_detection(Detection("yes", 0.9, 1.0, 1))  # its own, after the forged ones
        seen = until_on(home_assistant, FLEET.detections(kitchen))
        assert not [topic for topic, _ in seen if topic in forged], f"a forged message arrived: {seen}"
        assert json.loads(seen[-1][1])["event_type"] == "yes"
        home_assistant.close()

        # nothing was retained on hall-pi's topics: Home Assistant, subscribing again, gets none of them
        # before the retained message of the subscription after theirs (Mosquitto answers in order)
        hall_topics = (FLEET.detections(hall), FLEET.availability(hall), discovery[hall])
        subscriptions = (*hall_topics, FLEET.availability(kitchen), FLEET.detections(kitchen))
        home_assistant = Client(fleet("homeassistant"), subscriptions)
        clients.append(home_assistant.connected())
        online = (FLEET.availability(kitchen), b"online")
        assert until_on(home_assistant, FLEET.availability(kitchen)) == [online]

        # hall-pi's own listener writes them
        other = started(fleet(hall), hall, FLEET, DEFAULT_DISCOVERY_PREFIX)
        assert next_on(home_assistant, FLEET.availability(hall)) == b"online"
        other.on_model(Words(["on", "off"]))
        assert json.loads(next_on(home_assistant, discovery[hall]))["event_types"] == ["on", "off"]
        other.on_detection(Detection("off", 0.8, 2.0, 1))
        event = json.loads(next_on(home_assistant, FLEET.detections(hall)))
        assert (event["event_type"], event["listener"]) == ("off", hall)

        # nor may a device's daemon write a listener's words: hall-pi's, as kitchen-pi's listener
        daemon = Client(fleet("hall-pi")).connected()
        clients.append(daemon)
        daemon.publish(FLEET.detections(kitchen), b'{"event_type": "no", "forged": true}')
        other.on_detection(Detection("on", 0.8, 3.0, 1))  # a message the broker takes after it
        seen = until_on(home_assistant, FLEET.detections(hall))
        assert [topic for topic, _ in seen] == [FLEET.detections(hall)], f"a forged message arrived: {seen}"
        stopped(other)
    finally:
        stopped(publisher)
