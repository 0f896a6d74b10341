"""The device's MQTT side: its retained status with a last will, its signed tasks and withdrawals in, model
announcements in.

Tasks, withdrawals and announcements count only when signed by the coordinator's pinned key for their
topic: anyone who can publish on the broker could otherwise hand the device work or a model, or take its
work away. An empty message on the task topic only clears what the broker retains: it withdraws nothing.
"""

import logging
import queue
import threading
import time
from collections.abc import Callable

import paho.mqtt.client as mqtt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedspeech.protocol import bounds, messages, signing
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import DeviceStatus, ModelAnnouncement, Task, TaskWithdrawal
from fedspeech.protocol.mqtt import BrokerSettings, LastWill, connect, make_client, refusal_text, route
from fedspeech.protocol.topics import Topics

log = logging.getLogger(__name__)

MAX_REMEMBERED_TASKS = 1000  # task ids kept to ignore re-deliveries
MAX_QUEUED_TASKS = 16  # tasks waiting for the device; more are dropped


class BrokerLink:
    """One paho client per device; its callbacks only fill the queue and call on_announcement.

    on_task, if given, is called on the MQTT thread with each task queued; on_announcement with each
    verified model announcement; on_connected on each connection to the broker (what it retains may have
    been replaced meanwhile). ValueError for broker settings that cannot work.
    """

    def __init__(
        self,
        broker: BrokerSettings,
        topics: Topics,
        device_id: str,
        key: Ed25519PublicKey,
        on_announcement: Callable[[ModelAnnouncement], None] | None = None,
        on_connected: Callable[[], None] | None = None,
        on_task: Callable[[Task], None] | None = None,
    ) -> None:
        self.broker, self.topics, self.device_id, self.key = broker, topics, device_id, key
        self.tasks: queue.Queue[Task] = queue.Queue(MAX_QUEUED_TASKS)
        self._seen: dict[str, None] = {}  # task ids in arrival order
        self._withdrawn: set[str] = set()  # tasks whose round closed before they were done
        self._status: DeviceStatus | None = None
        self._lock = threading.Lock()
        offline = messages.encode(DeviceStatus(device_id, "offline"))
        # the root in the client id: one broker may carry fleets whose devices share an id, and a second
        # session under the same client id would end the first (a broker that makes user names client ids
        # overrides it, as deploy/mosquitto.conf does)
        client_id = f"{topics.root}/{device_id}"
        self._client = make_client(broker, client_id, LastWill(topics.status(device_id), offline))
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._on_announcement, self._on_connected, self._on_task_queued = (
            on_announcement,
            on_connected,
            on_task,
        )
        route(self._client, topics.task(device_id), lambda message: self._on_task(bytes(message.payload)))
        if on_announcement is not None:
            route(self._client, topics.model, lambda message: self._on_model(bytes(message.payload)))
        self._stopping = False

    def start(self, status: DeviceStatus) -> None:
        """Connect in the background (paho reconnects with backoff) and publish status on every connect."""
        self._status = status
        connect(self._client, self.broker)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.warning("%s", refusal_text(self.broker, reason_code))
            return
        log.info("connected to broker %s", self.broker.url)
        client.subscribe(self.topics.task(self.device_id), qos=1)
        if self._on_announcement is not None:
            client.subscribe(self.topics.model, qos=1)
        if self._on_connected is not None:
            self._on_connected()
        self.publish_status()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        if not self._stopping:
            log.info("disconnected from broker (%s); reconnecting", reason_code)

    def publish_status(self, status: DeviceStatus | None = None) -> mqtt.MQTTMessageInfo | None:
        """Remember the status (re-sent on every reconnect) and publish it retained."""
        with self._lock:  # the MQTT thread re-publishes on reconnect: keep the newest status last
            if status is not None:
                self._status = status
            if self._status is None:
                return None
            return self._client.publish(
                self.topics.status(self.device_id), messages.encode(self._status), qos=1, retain=True
            )

    def _on_task(self, payload: bytes) -> None:
        """Queue a signed, valid, new task due within MAX_TASK_SECONDS, or note a signed withdrawal; log and
        drop anything else.
        """
        if not payload:
            log.info("the retained task was cleared (an empty message, unsigned): nothing is withdrawn")
            return
        try:
            body = signing.verify(self.key, self.topics.task(self.device_id), payload)
            task = messages.decode_either(body, Task, TaskWithdrawal)
        except ProtocolError as exc:
            log.warning("dropping a task: %s", exc)
            return
        if isinstance(task, TaskWithdrawal):
            # The coordinator withdraws tasks when their round closes: whatever is not done yet is not wanted,
            # and uploading it would only cost the device's bandwidth. A task withdrawn before it arrived (a
            # replay) is not taken either.
            for task_id in task.task_ids:
                self._remember(task_id)
                self._withdrawn.add(task_id)
            return
        if task.task_id in self._seen:
            return  # re-delivered after a reconnect
        now = time.time()
        if task.deadline < now:
            log.info("ignoring task %s of round %d: its deadline has passed", task.task_id, task.round)
            return
        if task.deadline > now + bounds.MAX_TASK_SECONDS:
            log.warning(
                "dropping task %s of round %d: its deadline is %.0f s away, more than a task's %d s",
                task.task_id, task.round, task.deadline - now, bounds.MAX_TASK_SECONDS,
            )  # fmt: skip
            return
        try:
            self.tasks.put_nowait(task)
        except queue.Full:
            log.warning(
                "dropping task %s of round %d: %d tasks wait already",
                task.task_id,
                task.round,
                MAX_QUEUED_TASKS,
            )
            return
        self._remember(task.task_id)
        if self._on_task_queued is not None:
            self._on_task_queued(task)

    def _remember(self, task_id: str) -> None:
        """Note a task id as seen, forgetting the oldest beyond MAX_REMEMBERED_TASKS."""
        self._seen[task_id] = None
        if len(self._seen) > MAX_REMEMBERED_TASKS:
            oldest = next(iter(self._seen))
            del self._seen[oldest]
            self._withdrawn.discard(oldest)

    def withdrawn(self, task: Task) -> bool:
        """Whether the coordinator withdrew the task (its round took the results it needed)."""
        return task.task_id in self._withdrawn

    def withdraw(self, task: Task) -> None:
        """Note a task the coordinator no longer wants (it refused its acknowledgement)."""
        self._withdrawn.add(task.task_id)

    def _on_model(self, payload: bytes) -> None:
        if not payload or self._on_announcement is None:
            return  # the retained announcement was cleared
        try:
            body = signing.verify(self.key, self.topics.model, payload)
            announcement = messages.decode(body, ModelAnnouncement)
        except ProtocolError as exc:
            log.warning("dropping a model announcement: %s", exc)
            return
        self._on_announcement(announcement)

    def go_offline(self) -> None:
        """Publish the retained offline status, wait for the broker to take it, disconnect."""
        self._stopping = True
        info = self.publish_status(DeviceStatus(self.device_id, "offline"))
        if info is not None and self._client.is_connected():
            try:
                info.wait_for_publish(timeout=5)
            except (ValueError, RuntimeError) as exc:
                log.warning("could not publish the offline status: %s", exc)
        self._client.disconnect()
        self._client.loop_stop()
        log.info("%s offline", self.device_id)
