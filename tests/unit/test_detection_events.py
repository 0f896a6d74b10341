"""Detections as MQTT events and a Home Assistant event entity: the messages, the topics, the ACL lines."""

import json
import re
from datetime import datetime

import pytest

from fedspeech.coordinator.broker import broker_users
from fedspeech.protocol.bounds import MAX_LABELS
from fedspeech.protocol.topics import Topics, event_discovery, listen_user, shares_a_user
from fedspeech.runtime.detection_events import (
    OFFLINE,
    DetectionPublisher,
    discovery_config,
    event_payload,
    publisher_will,
    unique_id,
)
from fedspeech.runtime.streaming import Detection

TOPICS = Topics("fleet/v2")
NAME = listen_user("kitchen-pi")
LABELS = ["_none_", "yes", "no", "lights_on", "_unknown_"]
# Home Assistant's discovery topic (homeassistant/components/mqtt/discovery.py, TOPIC_MATCHER)
HA_TOPIC = re.compile(
    r"(?P<component>\w+)/(?:(?P<node_id>[a-zA-Z0-9_-]+)/)?(?P<object_id>[a-zA-Z0-9_-]+)/config"
)


class FakeModel:
    """What the publisher reads of a model: its labels and how they are said."""

    def __init__(self, labels: list[str], say: dict[str, str] | None = None) -> None:
        self.labels, self.say = labels, say or {}

    def spoken(self, label: str) -> str:
        return self.say.get(label, label.replace("_", " "))


class Sent:
    """paho's MQTTMessageInfo of a published message: wait_for_publish raises if the connection went."""

    def __init__(self, lost: bool) -> None:
        self.lost = lost

    def wait_for_publish(self, timeout: float | None = None) -> None:
        if self.lost:
            raise RuntimeError("message publish failed: The client is not currently connected.")


class FakeClient:
    """The part of a paho client the publisher uses, recording what is published."""

    def __init__(self, connected: bool = True) -> None:
        self.connected, self.on_connect, self.published = connected, None, []
        self.lose = False  # the connection goes before the broker acknowledges

    def is_connected(self) -> bool:
        return self.connected

    def publish(self, topic, payload, qos=0, retain=False) -> Sent:
        self.published.append((topic, payload, qos, retain))
        return Sent(self.lose)

    def connect_now(self) -> None:
        """As paho does on a CONNACK that accepts the connection."""
        self.connected = True
        self.on_connect(self, None, {}, type("Code", (), {"is_failure": False})(), None)


def test_the_discovery_config_is_an_event_entity_of_the_models_words():
    config = discovery_config(NAME, LABELS, TOPICS)
    required = {"name", "unique_id", "state_topic", "event_types", "device", "availability"}
    assert required <= set(config)
    assert config["event_types"] == ["yes", "no", "lights_on"]  # the words, in the model's order
    assert config["state_topic"] == "fleet/v2/listeners/kitchen-pi-listen/detections"
    assert config["availability"] == [
        {
            "topic": "fleet/v2/listeners/kitchen-pi-listen/availability",
            "payload_available": "online",
            "payload_not_available": "offline",
        }
    ]
    device = config["device"]
    assert device["identifiers"] == ["fedspeech_kitchen-pi-listen"] and device["name"] == NAME
    assert {"manufacturer", "model", "sw_version"} <= set(device)
    assert (
        config["unique_id"] == unique_id(NAME) == discovery_config(NAME, ["on", "off"], TOPICS)["unique_id"]
    )
    assert unique_id(NAME) != unique_id(listen_user("hall-pi"))
    json.dumps(config)  # JSON as it is

    topic = event_discovery("homeassistant", NAME)
    assert topic == "homeassistant/event/kitchen-pi-listen/detections/config"
    match = HA_TOPIC.fullmatch(topic.removeprefix("homeassistant/"))
    assert match and match["component"] == "event" and match["node_id"] == NAME


def test_event_types_are_bounded():
    many = [f"word{i}" for i in range(3 * MAX_LABELS)] + ["x" * 500, "bad label", "yes", "yes"]
    types = discovery_config(NAME, many, TOPICS)["event_types"]
    assert len(types) == MAX_LABELS and all(len(t) <= 64 and " " not in t for t in types)
    assert discovery_config(NAME, ["yes", "yes", "x" * 65], TOPICS)["event_types"] == ["yes"]


def test_an_event_is_the_detection_in_home_assistants_format_without_audio():
    detection = Detection("lights_on", 0.91234567, 12.3456789, model_round=7)
    payload = event_payload(detection, "lights on", 1_700_000_000.25, NAME)
    assert payload == {
        "event_type": "lights_on",
        "label": "lights_on",
        "spoken": "lights on",
        "confidence": 0.9123,
        "time": "2023-11-14T22:13:20.250Z",
        "epoch_s": 1_700_000_000.25,
        "stream_time_s": 12.346,
        "model_round": 7,
        "listener": NAME,
    }
    assert datetime.fromisoformat(payload["time"]).timestamp() == 1_700_000_000.25
    assert event_payload(Detection("yes", 0.7, 1.0), "y" * 500, 0.0)["spoken"] == "y" * 100
    assert event_payload(Detection("yes", 0.7, 1.0), "yes", 0.0)["model_round"] is None
    assert len(json.dumps(event_payload(detection, "s" * 10_000, 0.0, "n" * 71))) < 1000


def test_a_name_with_a_dot_cannot_name_a_discovery_topic_but_may_publish_without_one():
    dotted = listen_user("pi.kitchen")
    with pytest.raises(ValueError, match=r"letters, digits, '_' and '-' only"):
        discovery_config(dotted, LABELS, TOPICS)
    with pytest.raises(ValueError, match="Home Assistant discovery"):
        DetectionPublisher(FakeClient(), dotted, TOPICS)
    publisher = DetectionPublisher(FakeClient(), dotted, TOPICS, discovery_prefix=None)
    assert publisher.detections_topic == "fleet/v2/listeners/pi.kitchen-listen/detections"
    assert publisher_will(dotted, TOPICS).topic == "fleet/v2/listeners/pi.kitchen-listen/availability"
    for bad in ("a/b", "a+", "#", ""):
        with pytest.raises(ValueError, match="one MQTT topic level"):
            DetectionPublisher(FakeClient(), bad, TOPICS, discovery_prefix=None)
    for prefix in ("home/#", "", "a//b", "home assistant"):
        with pytest.raises(ValueError, match="discovery prefix"):
            DetectionPublisher(FakeClient(), NAME, TOPICS, discovery_prefix=prefix)


def test_the_will_says_offline_on_the_availability_topic():
    will = publisher_will(NAME, TOPICS)
    assert (will.topic, will.payload) == (TOPICS.availability(NAME), OFFLINE.encode())


def test_the_publisher_announces_itself_on_connection_and_new_labels():
    client = FakeClient(connected=False)
    publisher = DetectionPublisher(client, NAME, TOPICS, discovery_prefix="ha")
    publisher.attach()
    publisher.on_model(FakeModel(LABELS))  # not connected: sent at the connection
    assert client.published == []
    client.connect_now()
    config_topic = "ha/event/kitchen-pi-listen/detections/config"
    (topic, config, qos, retain), online = client.published
    assert (topic, qos, retain) == (config_topic, 1, True)
    assert json.loads(config)["event_types"] == ["yes", "no", "lights_on"]
    assert online == (TOPICS.availability(NAME), "online", 1, True)

    client.published.clear()
    publisher.on_model(FakeModel(list(LABELS)))  # the next round, the same words: nothing to say
    assert client.published == []
    publisher.on_model(FakeModel(["_none_", "on", "off"], {"on": "switch on"}))
    ((topic, config, _, retain),) = client.published
    assert topic == config_topic and retain and json.loads(config)["event_types"] == ["on", "off"]

    client.published.clear()
    publisher.on_detection(Detection("on", 0.8, 2.5, 3))
    ((topic, payload, qos, retain),) = client.published
    assert (topic, qos, retain) == (TOPICS.detections(NAME), 1, False)
    event = json.loads(payload)
    assert (event["event_type"], event["spoken"], event["model_round"]) == ("on", "switch on", 3)

    client.connected = False  # dropped, not queued, while the broker is away
    publisher.on_detection(Detection("off", 0.8, 3.5, 3))
    client.connect_now()
    publisher.on_detection(Detection("on", 0.9, 4.5, 3))
    events = [json.loads(p)["stream_time_s"] for t, p, *_ in client.published if t == TOPICS.detections(NAME)]
    assert events == [2.5, 4.5]


def test_closing_says_offline_unless_the_connection_is_gone():
    client = FakeClient()
    publisher = DetectionPublisher(client, NAME, TOPICS)
    publisher.close()
    assert client.published == [(TOPICS.availability(NAME), "offline", 1, True)]
    client.lose = True
    publisher.close()  # the connection went meanwhile: its last will says offline, close only logs
    client.published.clear()
    client.connected = False
    publisher.close()
    assert client.published == []


def test_the_acl_lets_each_listener_write_its_own_topics_and_home_assistant_read_them():
    acl = broker_users.acl_text(TOPICS, "ha")
    for line in (
        "pattern write fleet/v2/listeners/%u/detections",
        "pattern write fleet/v2/listeners/%u/availability",
        "pattern write ha/event/%u/detections/config",
        "pattern write fleet/v2/devices/%u/status",  # the devices' rules as they were
        "pattern read fleet/v2/devices/%u/task",
        "pattern read fleet/v2/model",
    ):
        assert f"\n{line}\n" in acl
    home_assistant = acl[acl.index("user homeassistant\n") :]
    assert home_assistant.splitlines()[1:] == [
        "topic read fleet/v2/listeners/#",
        "topic read ha/#",
        "topic write ha/status",
    ]
    writes = [line for line in acl.splitlines() if line.startswith(("pattern write", "topic write"))]
    listener_writes = [line for line in writes if "%u" in line]
    assert all(line.split()[-1].count("%u") == 1 for line in listener_writes)
    assert shares_a_user("homeassistant") and not shares_a_user("kitchen-pi")
