"""The device's MQTT side: its retained status with a last will, its tasks in, model announcements in."""

import logging
import queue
import threading
import time

import paho.mqtt.client as mqtt

from fedspeech.protocol import messages
from fedspeech.protocol.messages import DeviceStatus, ModelAnnouncement, Task
from fedspeech.protocol.mqtt import LastWill, make_client, route
from fedspeech.protocol.topics import Topics, parse_broker_url

log = logging.getLogger(__name__)

MAX_REMEMBERED_TASKS = 1000  # task ids kept to ignore re-deliveries


class DeviceLink:
    """One paho client per device; its callbacks only fill the queue and the fields below."""

    def __init__(self, broker_url: str, topics: Topics, device_id: str, follow_models: bool = False) -> None:
        self.broker_url, self.topics, self.device_id = broker_url, topics, device_id
        self.tasks: queue.Queue[Task] = queue.Queue()
        self.announced: ModelAnnouncement | None = None  # the newest global model announced
        self._seen: dict[str, None] = {}  # task ids in arrival order
        self._withdrawn: set[str] = set()  # tasks whose round closed before they were done
        self._status: DeviceStatus | None = None
        self._lock = threading.Lock()
        offline = messages.encode(DeviceStatus(device_id, "offline"))
        self._client = make_client(device_id, LastWill(topics.status(device_id), offline))
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._follow_models = follow_models
        route(self._client, topics.task(device_id), lambda message: self._on_task(bytes(message.payload)))
        if follow_models:
            route(self._client, topics.model, lambda message: self._on_announcement(bytes(message.payload)))
        self._stopping = False

    def start(self, status: DeviceStatus) -> None:
        """Connect in the background (paho reconnects with backoff) and publish status on every connect."""
        self._status = status
        host, port = parse_broker_url(self.broker_url)
        self._client.connect_async(host, port)
        self._client.loop_start()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.warning("broker %s refused the connection: %s", self.broker_url, reason_code)
            return
        log.info("connected to broker %s", self.broker_url)
        client.subscribe(self.topics.task(self.device_id), qos=1)
        if self._follow_models:
            client.subscribe(self.topics.model, qos=1)
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
        """Queue a valid, new, unexpired task; log and drop anything else."""
        if not payload:
            # The coordinator clears the task when its round closes: whatever is not done yet is not wanted,
            # and uploading it would only cost the device's bandwidth.
            self._withdrawn.update(self._seen)
            return
        try:
            task = messages.decode(payload, Task)
        except messages.ProtocolError as exc:
            log.warning("dropping malformed task: %s", exc)
            return
        if task.task_id in self._seen:
            return  # re-delivered after a reconnect
        if task.deadline < time.time():
            log.info("ignoring task %s of round %d: its deadline has passed", task.task_id, task.round)
            return
        self._seen[task.task_id] = None
        if len(self._seen) > MAX_REMEMBERED_TASKS:
            oldest = next(iter(self._seen))
            del self._seen[oldest]
            self._withdrawn.discard(oldest)
        self.tasks.put(task)

    def withdrawn(self, task: Task) -> bool:
        """Whether the coordinator withdrew the task (its round took the results it needed)."""
        return task.task_id in self._withdrawn

    def _on_announcement(self, payload: bytes) -> None:
        try:
            announcement = messages.decode(payload, ModelAnnouncement)
        except messages.ProtocolError as exc:
            log.warning("dropping malformed model announcement: %s", exc)
            return
        if announcement.onnx is not None:
            self.announced = announcement

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
