"""A listener's detections over MQTT, each one both a fedspeech event and a Home Assistant event entity's.

Torch-free. A DetectionPublisher publishes, on an MQTT client it is given (one broker login per process,
shared with the model follower: the client's owner makes it with `publisher_will` and connects it after
`attach`):

- each detection as JSON on the listener's own topic, `Topics.detections(name)`, QoS 1, not retained:
  `{"event_type": label, "label", "spoken", "confidence", "time" (wall clock, ISO 8601 UTC), "epoch_s",
  "stream_time_s", "model_round", "listener"}` (`event_payload`), never audio. `event_type` makes the same
  message the state of a Home Assistant event entity;
- "online", retained, on `Topics.availability(name)` at each connection, and "offline" there as the
  client's last will (and from `close`);
- the retained Home Assistant MQTT discovery config of one event entity (`discovery_config`), its
  `event_types` the model's word labels, at each connection and whenever a new model brings other labels.

The name is the listener's broker user (`<device id>-listen` on the fleet's broker), so that a Mosquitto
ACL can let each listener write its own topics only (`pattern write .../listeners/%u/detections`). Home
Assistant's discovery topics allow ASCII letters, digits, '_' and '-' only in the name: a name with a '.' (a
device id may have one) is refused with discovery on, and may publish with discovery off.

A detection heard while the broker is unreachable is dropped, not queued: an event is worth acting on only
while it is fresh. Publishing never blocks the audio thread (paho queues the packet for its own thread).
"""

import json
import logging
import re
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import paho.mqtt.client as mqtt

from fedspeech.protocol.bounds import MAX_LABELS, NAME
from fedspeech.protocol.labels import is_word
from fedspeech.protocol.labels import spoken as spoken_form
from fedspeech.protocol.mqtt import LastWill, add_on_connect
from fedspeech.protocol.topics import DEFAULT_DISCOVERY_PREFIX, Topics, event_discovery
from fedspeech.runtime.session import OnnxModel
from fedspeech.runtime.streaming import Detection
from fedspeech.runtime.version import fedspeech_version

log = logging.getLogger(__name__)

ONLINE, OFFLINE = "online", "offline"
HA_ID = re.compile(r"^[a-zA-Z0-9_-]+\Z")  # Home Assistant's node and object ids in a discovery topic
LEVEL = re.compile(r"^[^/+#\x00-\x1f\x7f]{1,100}\Z")  # one topic level: no separator, wildcard or control
PREFIX = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*\Z")
MAX_SPOKEN_CHARS = 100
CLOSE_S = 2.0  # at most, waiting for the broker to take "offline" at close
QOS = 1


VERSION = fedspeech_version() or "unknown"


def check_name(name: str, discovery: bool = True) -> None:
    """ValueError, in words a user can act on, for a listener name its topics cannot carry."""
    if not LEVEL.match(name):
        raise ValueError(
            f"the listener name {name[:100]!r} cannot be one MQTT topic level (no '/', '+', '#')"
        )
    if discovery and not HA_ID.match(name):
        raise ValueError(
            f"the listener name {name!r} cannot name a Home Assistant discovery topic, whose node ids allow "
            "ASCII letters, digits, '_' and '-' only: give the device an id without '.', or publish without "
            "Home Assistant discovery"
        )


def check_prefix(prefix: str) -> None:
    """ValueError for a discovery prefix that is not a plain topic (no wildcard, space or empty level)."""
    if not PREFIX.match(prefix):
        raise ValueError(
            f"discovery prefix {prefix!r}: use ASCII letters, digits, '_', '.' and '-', "
            "with '/' between levels"
        )


def publisher_will(name: str, topics: Topics) -> LastWill:
    """The last will of the client a DetectionPublisher publishes on: its listener "offline"."""
    check_name(name, discovery=False)
    return LastWill(topics.availability(name), OFFLINE.encode())


def event_types(labels: Sequence[str]) -> list[str]:
    """The labels a listener can detect, as its event entity's event types: the words, bounded in number
    and length (a label a task could not name is left out).
    """
    words = [label for label in labels if is_word(label) and NAME.match(label)]
    return list(dict.fromkeys(words))[:MAX_LABELS]


def unique_id(name: str) -> str:
    """The event entity's unique id in Home Assistant, the same for a listener across restarts."""
    return f"fedspeech_{name}_detections"


def discovery_config(name: str, labels: Sequence[str], topics: Topics) -> dict[str, Any]:
    """The Home Assistant MQTT discovery config of the listener's event entity; ValueError for a name that
    a discovery topic cannot carry.
    """
    check_name(name)
    origin = {"name": "fedspeech", "sw_version": VERSION}
    return {
        "name": "Detections",
        "unique_id": unique_id(name),
        "state_topic": topics.detections(name),
        "event_types": event_types(labels),
        "qos": QOS,
        "icon": "mdi:account-voice",
        "availability": [
            {
                "topic": topics.availability(name),
                "payload_available": ONLINE,
                "payload_not_available": OFFLINE,
            }
        ],
        "device": {
            "identifiers": [f"fedspeech_{name}"],
            "name": name,
            "manufacturer": "fedspeech",
            "model": "fedspeech listen",
            "sw_version": VERSION,
        },
        "origin": origin,
    }


def event_payload(detection: Detection, spoken: str, now: float, listener: str = "") -> dict[str, Any]:
    """A detection as the JSON of its event: `event_type` its label, so Home Assistant takes it as is;
    now is the wall-clock time of the detection (seconds since the epoch).
    """
    payload: dict[str, Any] = {
        "event_type": detection.label,
        "label": detection.label,
        "spoken": spoken[:MAX_SPOKEN_CHARS],
        "confidence": round(float(detection.confidence), 4),
        "time": datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "epoch_s": round(now, 3),
        "stream_time_s": round(float(detection.time_s), 3),
        "model_round": detection.model_round,
    }
    if listener:
        payload["listener"] = listener
    return payload


class DetectionPublisher:
    """Publishes a listener's detections, its availability and its Home Assistant discovery config on a
    client it is given (see the module). discovery_prefix None: no discovery config; ValueError for a name
    or prefix the topics cannot carry.

        client = make_client(settings, user, publisher_will(user, topics))
        publisher = DetectionPublisher(client, user, topics)
        publisher.attach()
        connect(client, settings)
        Listener(..., on_detection=publisher.on_detection, on_model=publisher.on_model)
        ...
        publisher.close()  # "offline", before the owner disconnects
    """

    def __init__(
        self,
        client: mqtt.Client,
        name: str,
        topics: Topics,
        discovery_prefix: str | None = DEFAULT_DISCOVERY_PREFIX,
    ) -> None:
        check_name(name, discovery=discovery_prefix is not None)
        if discovery_prefix is not None:
            check_prefix(discovery_prefix)
        self.client, self.name, self.topics = client, name, topics
        self.detections_topic = topics.detections(name)
        self.availability_topic = topics.availability(name)
        self.discovery_topic = None if discovery_prefix is None else event_discovery(discovery_prefix, name)
        self._lock = threading.Lock()
        self._model: OnnxModel | None = None
        self._labels: list[str] | None = None  # the event types of the newest model
        self._dropped = 0  # detections dropped while disconnected, since the last one published

    def attach(self) -> None:
        """Publish "online" and the discovery config on each successful (re)connection of the client."""
        add_on_connect(self.client, self._on_connect)
        log.info(
            "publishing detections on %s%s",
            self.detections_topic,
            f", Home Assistant discovery on {self.discovery_topic}" if self.discovery_topic else "",
        )

    def on_model(self, model: OnnxModel) -> None:
        """Take the listener's new model; republish the discovery config if its words differ."""
        labels = event_types(model.labels)
        with self._lock:  # one config at a time, the newest last, whichever thread publishes it
            self._model = model
            changed, self._labels = labels != self._labels, labels
            if changed and self.client.is_connected():  # else at the next connection
                self._publish_discovery(labels)

    def on_detection(self, detection: Detection) -> None:
        """Publish one detection (QoS 1, not retained); dropped, and counted, while disconnected."""
        model = self._model
        spoken = model.spoken(detection.label) if model is not None else spoken_form(detection.label, {})
        payload = event_payload(detection, spoken, time.time(), self.name)
        if not self.client.is_connected():
            self._dropped += 1
            if self._dropped == 1:
                log.warning(
                    "not connected to the broker: dropping detections until it is (%s)", detection.label
                )
            return
        if self._dropped:
            log.info("connected again: %d detection(s) heard meanwhile were dropped", self._dropped)
            self._dropped = 0
        self.client.publish(self.detections_topic, json.dumps(payload), qos=QOS, retain=False)
        log.debug("published %s on %s", detection.label, self.detections_topic)

    def close(self, timeout_s: float = CLOSE_S) -> None:
        """Say "offline" (retained) before the client's owner disconnects it, which sends no last will."""
        if not self.client.is_connected():
            return
        info = self.client.publish(self.availability_topic, OFFLINE, qos=QOS, retain=True)
        try:
            info.wait_for_publish(timeout_s)
        except (ValueError, RuntimeError) as exc:  # the connection went meanwhile: its last will says it
            log.info("could not say offline on %s: %s", self.availability_topic, exc)

    def _on_connect(self, client: mqtt.Client) -> None:
        """On the network thread: the discovery config (once a model is known), then "online"."""
        with self._lock:
            if self._labels is not None:
                self._publish_discovery(self._labels)
        client.publish(self.availability_topic, ONLINE, qos=QOS, retain=True)

    def _publish_discovery(self, labels: list[str]) -> None:
        """The retained discovery config for these event types, if discovery is on."""
        if self.discovery_topic is None:
            return
        config = discovery_config(self.name, labels, self.topics)
        self.client.publish(self.discovery_topic, json.dumps(config), qos=QOS, retain=True)
        log.info("published the Home Assistant discovery config of %s: %s", self.name, ", ".join(labels))
