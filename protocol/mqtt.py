"""The project's paho-mqtt client: callback API v2, automatic reconnection with backoff, a retained last will.

Every process that talks to the broker (coordinator, device daemon, listener) makes its client here, so that
connection settings (and TLS and credentials, when they come) are decided in one place.
"""

from collections.abc import Callable
from dataclasses import dataclass

import paho.mqtt.client as mqtt

RECONNECT_MIN_S, RECONNECT_MAX_S = 1, 30


@dataclass(frozen=True)
class LastWill:
    """What the broker publishes, retained with QoS 1, when a client vanishes without disconnecting."""

    topic: str
    payload: bytes


def make_client(client_id: str = "", last_will: LastWill | None = None) -> mqtt.Client:
    """A paho client that, once connected with connect_async and loop_start, reconnects by itself."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    if last_will is not None:
        client.will_set(last_will.topic, last_will.payload, qos=1, retain=True)
    client.reconnect_delay_set(min_delay=RECONNECT_MIN_S, max_delay=RECONNECT_MAX_S)
    return client


def route(client: mqtt.Client, topic_filter: str, handler: Callable[[mqtt.MQTTMessage], None]) -> None:
    """Call handler (on the network thread) with each message whose topic matches topic_filter."""
    # By topic, not on_message: some brokers (amqtt 0.12) also send retained messages of topics this client
    # never subscribed to.
    client.message_callback_add(topic_filter, lambda client, userdata, message: handler(message))
