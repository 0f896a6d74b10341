"""The coordinator's MQTT side: tracks device status, publishes tasks and model announcements."""

import logging
import threading
import uuid

import paho.mqtt.client as mqtt

from fedspeech.protocol import messages
from fedspeech.protocol.messages import DeviceStatus, ModelAnnouncement, ProtocolError, Task
from fedspeech.protocol.mqtt import make_client, route
from fedspeech.protocol.topics import Topics, parse_broker_url

log = logging.getLogger(__name__)


class CoordinatorLink:
    """One paho client: subscribes to every device's status, publishes tasks and the model."""

    def __init__(self, broker_url: str, topics: Topics) -> None:
        self.topics = topics
        self._host, self._port = parse_broker_url(broker_url)
        self._status: dict[str, DeviceStatus] = {}
        self._lock = threading.Lock()
        self.status_changed = threading.Condition(self._lock)
        client_id = f"fedspeech-coordinator-{uuid.uuid4().hex[:8]}"
        self._client = make_client(client_id)
        self._client.on_connect = self._on_connect
        route(self._client, topics.all_status, self._on_status)

    def start(self) -> None:
        """Connect in the background; paho reconnects with backoff on its own."""
        self._client.connect_async(self._host, self._port, keepalive=30)
        self._client.loop_start()

    def stop(self) -> None:
        """Disconnect and stop the network thread."""
        self._client.disconnect()
        self._client.loop_stop()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.warning("broker refused connection: %s", reason_code)
            return
        client.subscribe(self.topics.all_status, qos=1)
        log.info("connected to broker %s:%d", self._host, self._port)

    def _on_status(self, msg: mqtt.MQTTMessage) -> None:
        device_id = self.topics.device_of(msg.topic)
        if not msg.payload:
            return
        try:
            status = messages.decode(msg.payload, DeviceStatus)
            if status.device_id != device_id:
                raise ProtocolError(f"status for {status.device_id!r} on the topic of {device_id!r}")
        except ProtocolError as exc:
            log.warning("dropped malformed status on %s: %s", msg.topic, exc)
            return
        with self._lock:
            self._status[device_id] = status
            self.status_changed.notify_all()

    def statuses(self) -> dict[str, DeviceStatus]:
        """The latest status of every device heard from."""
        with self._lock:
            return dict(self._status)

    def online(self) -> list[str]:
        """Ids of devices whose latest status is not offline."""
        return sorted(d for d, s in self.statuses().items() if s.state != "offline")

    def publish_task(self, task: Task, device_id: str) -> None:
        """Send a device its task, retained so a reconnecting device still gets it."""
        self._client.publish(self.topics.task(device_id), messages.encode(task), qos=1, retain=True)

    def clear_task(self, device_id: str) -> None:
        """Remove a device's retained task."""
        self._client.publish(self.topics.task(device_id), b"", qos=1, retain=True)

    def announce(self, announcement: ModelAnnouncement) -> None:
        """Publish the new global model, retained for devices that join later."""
        self._client.publish(self.topics.model, messages.encode(announcement), qos=1, retain=True)
