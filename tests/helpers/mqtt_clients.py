"""A paho client of a test that records what happens to it, for checking what a broker allows.

Negative checks never sleep: each ends with a message that can only arrive after the forbidden one would
have (Mosquitto handles one connection's packets in order and delivers in order).
"""

import queue

import pytest

from fedspeech.protocol.mqtt import BrokerSettings, LastWill, connect, make_client

WAIT_S = 20


class Client:
    """A paho client of the test (made by protocol.mqtt) that records what happens to it."""

    def __init__(
        self,
        settings: BrokerSettings,
        subscriptions: tuple[str, ...] = (),
        client_id: str = "",
        will: LastWill | None = None,
    ) -> None:
        self.messages: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.events: queue.Queue[str] = queue.Queue()  # connected, refused, failed, disconnected
        self.subacks: queue.Queue[int] = queue.Queue()
        self.disconnects = 0
        self.subscriptions = subscriptions
        self.paho = make_client(settings, client_id, will)
        self.paho.on_connect = self._on_connect
        self.paho.on_connect_fail = lambda client, userdata: self.events.put("failed")
        self.paho.on_disconnect = self._on_disconnect
        self.paho.on_subscribe = lambda client, userdata, mid, codes, properties: self.subacks.put(mid)
        self.paho.on_message = lambda client, userdata, msg: self.messages.put((msg.topic, msg.payload))
        connect(self.paho, settings)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.events.put(f"refused: {reason_code}" if reason_code.is_failure else "connected")
        for topic in self.subscriptions:
            client.subscribe(topic, qos=1)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.disconnects += 1
        self.events.put("disconnected")

    def first_event(self, waiting_for: str = "the connection to succeed or fail") -> str:
        """What happened next to the connection: connected, refused: REASON, failed or disconnected."""
        try:
            return self.events.get(timeout=WAIT_S)
        except queue.Empty:
            pytest.fail(f"timed out waiting for {waiting_for}")

    def connected(self) -> "Client":
        """This client, once the broker has accepted it and taken its subscriptions."""
        assert (event := self.first_event()) == "connected", f"not connected: {event}"
        for _ in self.subscriptions:
            self.subacks.get(timeout=WAIT_S)
        return self

    def subscribe(self, topic: str) -> None:
        """Subscribe and wait for the broker's SUBACK (it grants every filter: the ACL acts on delivery)."""
        self.paho.subscribe(topic, qos=1)
        self.subacks.get(timeout=WAIT_S)

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        """Publish with QoS 1 and wait for the broker's PUBACK (a forbidden message is acked and dropped)."""
        self.paho.publish(topic, payload, qos=1, retain=retain).wait_for_publish(WAIT_S)

    def until(self, topic: str, payload: bytes) -> list[tuple[str, bytes]]:
        """Every message received up to and including (topic, payload)."""
        received = []
        while (topic, payload) not in received:
            try:
                received.append(self.messages.get(timeout=WAIT_S))
            except queue.Empty:
                shown = [(t, p[:40]) for t, p in received]
                pytest.fail(f"never received {payload[:40]!r} on {topic}; before it: {shown}")
        return received

    def close(self) -> None:
        """Disconnect cleanly (no last will)."""
        self.paho.disconnect()
        self.paho.loop_stop()
