"""The coordinator's MQTT side: tracks device status, publishes signed tasks, withdrawals and model
announcements.

A status is a hint (anyone on an open broker can publish one): the round loop waits only for devices that
acknowledged their tasks over HTTP (acknowledgements). A task is withdrawn by a signed withdrawal naming it,
retained in its place, so that an empty message from anyone withdraws nothing.

A topic root is one coordinator's: on its first connection the link reads the announcement retained on
the root before it announces anything, and one its key did not sign (another coordinator's, on a broker
they share) stops it, unless told to take the root over.
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
from fedspeech.protocol.mqtt import BrokerSettings, connect, make_client, refusal_text, route
from fedspeech.protocol.topics import Topics

log = logging.getLogger(__name__)

# Anyone who may publish on the broker can invent device ids, so the table of statuses has bounds:
MAX_TRACKED = 10_000  # devices whose status is kept at all
MAX_OFFLINE = 1_000  # of them offline; the longest offline are forgotten first
TURN_LOG_S, TURN_LOG_MOST = (
    60.0,
    4,
)  # a device's going offline or coming back: logged at most 4 times a minute


class TopicRootTaken(Exception):
    """Another coordinator's announcement is retained on the topic root; the text says what to do."""


class CoordinatorLink:
    """One paho client: subscribes to every device's status, publishes tasks and the model, signed."""

    def __init__(
        self,
        settings: BrokerSettings,
        topics: Topics,
        key: Ed25519PrivateKey,
        max_tracked: int = MAX_TRACKED,
        max_offline: int = MAX_OFFLINE,
        take_over: bool = False,
    ) -> None:
        self.topics, self.settings, self._key = topics, settings, key
        self.take_over = take_over  # announce over another coordinator's retained announcement
        self.max_tracked, self.max_offline = max_tracked, max_offline
        self._status: dict[str, DeviceStatus] = {}
        self._seen: dict[str, float] = {}  # when each tracked device's latest status arrived
        self._offline: OrderedDict[str, None] = OrderedDict()  # offline devices, longest offline first
        self._full_logged = False
        self._turn_logged: dict[str, list[float]] = {}  # when a device's going offline or back was logged
        self._handed_out: dict[str, list[str]] = {}  # device -> its tasks published and not yet withdrawn
        self._announcement: bytes | None = None  # the latest, signed as published
        self._lock = threading.Lock()
        self._announcing = threading.Lock()  # the latest announcement is the last one published
        # the topic root's check: the announcement retained there not ours; then whether the root is ours
        self._foreign = False
        self._status_subscription: int | None = None  # whose SUBACK ends the check
        self.checked = threading.Event()  # the check is over: the root is ours, or refusal says why not
        self.refusal: str | None = None
        self._announced = False  # a model announcement was published: a rival's afterwards is logged
        self._rival_said = False
        self._started = False  # check_topic_root has returned: a refusal from now on is logged
        self._client = make_client(settings, f"fedspeech-coordinator-{uuid.uuid4().hex[:8]}")
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_subscribe
        route(self._client, topics.all_status, self._on_status)
        route(self._client, topics.model, self._on_model)

    def start(self) -> None:
        """Connect in the background; paho reconnects with backoff on its own."""
        connect(self._client, self.settings, keepalive=30)

    def check_topic_root(self, timeout: float) -> None:
        """Wait up to timeout for the topic root's check; TopicRootTaken if it is another coordinator's.

        A broker not reached by then is checked when it is: until then nothing is announced, and a root
        found taken leaves `refusal` set.
        """
        self.checked.wait(timeout)
        self._started = True
        if self.refusal is not None:
            raise TopicRootTaken(self.refusal)
        if not self.checked.is_set():
            log.info("the topic root %s is checked once the broker answers", self.topics.root)

    def stop(self) -> None:
        """Disconnect and stop the network thread."""
        self._client.disconnect()
        self._client.loop_stop()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.warning("%s", refusal_text(self.settings, reason_code))
            return
        client.subscribe(self.topics.model, qos=0)  # a retained announcement arrives before the next SUBACK
        _, self._status_subscription = client.subscribe(self.topics.all_status, qos=1)
        log.info("connected to broker %s", self.settings.url)

    def _on_model(self, msg: mqtt.MQTTMessage) -> None:
        """Note an announcement this coordinator did not sign: retained, while the topic root is checked;
        any, after (another coordinator that started on the same root before either had announced).
        """
        if not msg.payload or (not self.checked.is_set() and not msg.retain):
            return
        try:
            signing.verify(self._key.public_key(), msg.topic, msg.payload)
            return
        except ProtocolError:
            pass
        if not self.checked.is_set():
            self._foreign = True
        elif not self._announced and not self.take_over and self.refusal is None:
            self.refusal = (
                f"another coordinator announced a model on the topic root {self.topics.root} on "
                f"{self.settings.url} before this one's first: give this one a --topic-root of its own (and "
                "its devices and listeners the same)"
            )
            log.error("%s", self.refusal)
        elif not self._rival_said:
            self._rival_said = True
            log.error(
                "another coordinator announces models on the topic root %s on %s: the devices take whichever "
                "model came last; stop it, or give it a --topic-root of its own",
                self.topics.root, self.settings.url,
            )  # fmt: skip

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        """After the SUBACK that follows the model topic's retained announcement, decide the topic root."""
        if mid != self._status_subscription or self.checked.is_set():
            return
        root = self.topics.root
        if self._foreign and not self.take_over:
            self.refusal = (
                f"the topic root {root} on {self.settings.url} holds a model announcement this coordinator "
                "did not sign (another coordinator's?): give this one a --topic-root of its own (and its "
                "devices and listeners the same), or --take-over-topic-root if that coordinator is gone"
            )
            if self._started:
                log.error("%s", self.refusal)
        elif self._foreign:
            log.warning("taking over the topic root %s from another coordinator's announcement", root)
        self.checked.set()  # still subscribed to the model topic: another coordinator's announcements show
        if self.refusal is None:
            self._publish_announcement()

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
        before = self._status.get(device_id)
        if before is not None and (before.state == "offline") != (status.state == "offline"):
            self._say_turned(device_id, status.state == "offline")
        self._status[device_id] = status
        self._seen[device_id] = time.time()
        if status.state == "offline":
            self._offline[device_id] = None
            while len(self._offline) > self.max_offline:
                self._forget(next(iter(self._offline)))

    def _say_turned(self, device_id: str, offline: bool) -> None:
        """Log that a device went offline or came back, at most TURN_LOG_MOST times in TURN_LOG_S a device:
        anyone on an open broker can flip a device's status."""
        now = time.monotonic()
        recent = [t for t in self._turn_logged.get(device_id, []) if now - t < TURN_LOG_S]
        if len(recent) < TURN_LOG_MOST:
            recent.append(now)
            log.info("device %s %s", device_id, "went offline" if offline else "is back online")
        self._turn_logged[device_id] = recent

    def _forget(self, device_id: str) -> None:
        self._turn_logged.pop(device_id, None)
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

    def _publish_signed(self, topic: str, message: Task | TaskWithdrawal) -> None:
        payload = signing.sign(self._key, topic, messages.encode(message))
        self._client.publish(topic, payload, qos=1, retain=True)

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
        """Publish the new global model, signed and retained for devices that join later.

        Kept, not published, until the topic root is checked and found this coordinator's.
        """
        payload = signing.sign(self._key, self.topics.model, messages.encode(announcement))
        with self._lock:
            self._announcement = payload
        if self.checked.is_set() and self.refusal is None:
            self._publish_announcement()

    def _publish_announcement(self) -> None:
        """Publish the latest announcement, retained; whichever thread comes last publishes the latest."""
        with self._announcing:
            with self._lock:
                payload = self._announcement
            if payload is not None:
                self._client.publish(self.topics.model, payload, qos=1, retain=True)
                self._announced = True

    def signed_announcement(self) -> bytes | None:
        """The latest announcement as published (signed for the model topic); None before the first."""
        with self._lock:
            return self._announcement
