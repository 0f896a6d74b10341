"""Anyone on the network with no credentials: a paho client on an open broker, which records what the
coordinator announces (to replay it) and publishes what it likes."""

import base64
import json
import threading

import paho.mqtt.client as mqtt

from fedspeech.protocol.topics import Topics, parse_broker_url


class Stranger:
    """A paho client on the broker, which also records the genuine announcements of the topics' model."""

    def __init__(self, broker_url: str, topics: Topics) -> None:
        self.announcements: dict[int, bytes] = {}  # round -> the signed payload the coordinator published
        self.published: list[str] = []  # topics it published on retained, cleared by close
        self._lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        self.client.on_connect = lambda c, *_: c.subscribe(topics.model, qos=1)
        self.client.message_callback_add(topics.model, self._on_model)
        self.client.connect(*parse_broker_url(broker_url))
        self.client.loop_start()

    def _on_model(self, client, userdata, msg) -> None:
        try:  # the stranger cannot sign, but can read what the coordinator signed, and replay it
            body = json.loads(base64.b64decode(json.loads(msg.payload)["body"]))
        except (ValueError, KeyError, TypeError):
            return  # one of the stranger's own
        with self._lock:
            self.announcements.setdefault(body["round"], bytes(msg.payload))

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        """Publish and wait until the broker has it."""
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(5)
        if retain:
            self.published.append(topic)

    def close(self) -> None:
        """Clear what it left retained, and disconnect."""
        for topic in self.published:
            self.client.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)
        self.client.loop_stop()
        self.client.disconnect()
