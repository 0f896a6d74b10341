"""The coordinator's MQTT side: tracks device status, publishes signed tasks, withdrawals and model
announcements.

A status is a hint (anyone on an open broker can publish one): the round loop waits only for devices that
acknowledged their tasks over HTTP (acknowledgements). A task is withdrawn by a signed withdrawal naming it,
retained in its place, so that an empty message from anyone withdraws nothing.
"""

import logging
import threading
import time
import uuid
from collections import OrderedDict

import paho.mqtt.client as mqtt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.protocol import messages, signing
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.message_checks import MAX_WITHDRAWN
from fedspeech.protocol.messages import DeviceStatus, ModelAnnouncement, Task, TaskWithdrawal
from fedspeech.protocol.mqtt import BrokerSettings, connect, make_client, route
from fedspeech.protocol.topics import Topics

log = logging.getLogger(__name__)

# Anyone who may publish on the broker can invent device ids, so the table of statuses has bounds:
MAX_TRACKED = 10_000  # devices whose status is kept at all
MAX_OFFLINE = 1_000  # of them offline; the longest offline are forgotten first


class CoordinatorLink:
    """One paho client: subscribes to every device's status, publishes tasks and the model, signed."""

    def __init__(
        self,
        settings: BrokerSettings,
        topics: Topics,
        key: Ed25519PrivateKey,
        max_tracked: int = MAX_TRACKED,
        max_offline: int = MAX_OFFLINE,
    ) -> None:
        self.topics, self.settings, self._key = topics, settings, key
        self.max_tracked, self.max_offline = max_tracked, max_offline
        self._status: dict[str, DeviceStatus] = {}
        self._seen: dict[str, float] = {}  # when each tracked device's latest status arrived
        self._offline: OrderedDict[str, None] = OrderedDict()  # offline devices, longest offline first
        self._full_logged = False
        self._handed_out: dict[str, list[str]] = {}  # device -> its tasks published and not yet withdrawn
        self._announcement: bytes | None = None  # the latest, signed as published
        self._lock = threading.Lock()
        self._client = make_client(settings, f"fedspeech-coordinator-{uuid.uuid4().hex[:8]}")
        self._client.on_connect = self._on_connect
        route(self._client, topics.all_status, self._on_status)

    def start(self) -> None:
        """Connect in the background; paho reconnects with backoff on its own."""
        connect(self._client, self.settings, keepalive=30)

    def stop(self) -> None:
        """Disconnect and stop the network thread."""
        self._client.disconnect()
        self._client.loop_stop()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.warning("broker %s refused the connection: %s", self.settings.url, reason_code)
            return
        client.subscribe(self.topics.all_status, qos=1)
        log.info("connected to broker %s", self.settings.url)

    def _on_status(self, msg: mqtt.MQTTMessage) -> None:
        device_id = self.topics.device_of(msg.topic)
        if device_id is None:
            return
        if not msg.payload:  # the retained status was cleared: the device is gone
            with self._lock:
                self._forget(device_id)
            return
        try:
            status = messages.decode(msg.payload, DeviceStatus)
            if status.device_id != device_id:
                raise ProtocolError(f"status for {status.device_id!r} on the topic of {device_id!r}")
        except ProtocolError as exc:
            log.warning("dropped malformed status on %s: %s", msg.topic[:200], exc)
            return
        with self._lock:
            self._track(status)

    def _track(self, status: DeviceStatus) -> None:
        """Keep a device's latest status within the bounds; call with the lock held."""
        device_id = status.device_id
        self._offline.pop(device_id, None)
        if device_id not in self._status and len(self._status) >= self.max_tracked:
            if not self._offline:
                if not self._full_logged:
                    log.warning(
                        "tracking the status of %d devices already: statuses of further devices are "
                        "ignored until some go offline",
                        self.max_tracked,
                    )
                    self._full_logged = True
                return
            self._forget(next(iter(self._offline)))
        self._status[device_id] = status
        self._seen[device_id] = time.time()
        if status.state == "offline":
            self._offline[device_id] = None
            while len(self._offline) > self.max_offline:
                self._forget(next(iter(self._offline)))

    def _forget(self, device_id: str) -> None:
        self._status.pop(device_id, None)
        self._seen.pop(device_id, None)
        self._offline.pop(device_id, None)

    def statuses(self) -> dict[str, DeviceStatus]:
        """The latest status of every device heard from (within the bounds)."""
        with self._lock:
            return dict(self._status)

    def last_seen(self) -> dict[str, float]:
        """When the latest status of every tracked device arrived (Unix time)."""
        with self._lock:
            return dict(self._seen)

    def online(self) -> list[str]:
        """Ids of devices whose latest status is not offline."""
        return sorted(d for d, s in self.statuses().items() if s.state != "offline")

    def _publish_signed(self, topic: str, message: Task | TaskWithdrawal | ModelAnnouncement) -> bytes:
        payload = signing.sign(self._key, topic, messages.encode(message))
        self._client.publish(topic, payload, qos=1, retain=True)
        return payload

    def publish_task(self, task: Task, device_id: str) -> None:
        """Send a device its signed task, retained so a reconnecting device still gets it."""
        with self._lock:
            handed_out = self._handed_out.setdefault(device_id, [])
            handed_out.append(task.task_id)
            del handed_out[:-MAX_WITHDRAWN]
        self._publish_signed(self.topics.task(device_id), task)

    def clear_task(self, device_id: str) -> None:
        """Withdraw a device's tasks: a signed withdrawal naming them, retained in place of the last one."""
        with self._lock:
            handed_out = self._handed_out.pop(device_id, [])
        self._publish_signed(self.topics.task(device_id), TaskWithdrawal(handed_out))

    def announce(self, announcement: ModelAnnouncement) -> None:
        """Publish the new global model, signed and retained for devices that join later."""
        payload = self._publish_signed(self.topics.model, announcement)
        with self._lock:
            self._announcement = payload

    def signed_announcement(self) -> bytes | None:
        """The latest announcement as published (signed for the model topic); None before the first."""
        with self._lock:
            return self._announcement
