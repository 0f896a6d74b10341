"""Follows the coordinator's retained model announcement and loads each new ONNX model it announces.

Torch-free. On paho's network thread each newly announced model is downloaded (its size and sha256 checked,
as the device daemon does) and loaded, then handed over: the listening thread takes it with `take` and
swaps it in between two frames, so no audio is dropped. A model that cannot be downloaded, does not match
its announcement or does not load is logged and the current one kept.
"""

import logging
import threading
import uuid
from typing import Any

from fedspeech.edge_client.coordinator_http import Dropped, fetch_blob
from fedspeech.edge_client.onnx_model import ModelError, OnnxModel, load_model
from fedspeech.protocol import messages
from fedspeech.protocol.messages import ModelAnnouncement
from fedspeech.protocol.topics import DEFAULT_ROOT, Topics, parse_broker_url

log = logging.getLogger(__name__)


class ModelFollower:
    """The newest announced model, loaded in the background; ValueError for a broker URL that is not one."""

    def __init__(self, coordinator_url: str, broker_url: str, topic_root: str = DEFAULT_ROOT):
        self._broker = parse_broker_url(broker_url)
        self.coordinator_url = coordinator_url.rstrip("/")
        self.broker_url = broker_url
        self.topic = Topics(topic_root).model
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()  # ends a download's retries
        self._pending: OnnxModel | None = None
        self._digest: str | None = None  # of the newest model loaded
        self._client: Any = None

    def start(self) -> None:
        """Connect to the broker (reconnecting by itself) and subscribe to the model announcement."""
        from fedspeech.protocol.mqtt import make_client, route

        client = make_client(f"fedspeech-listen-{uuid.uuid4().hex[:8]}")

        def on_connect(client, userdata, flags, reason_code, properties) -> None:
            if reason_code.is_failure:
                log.warning("broker %s refused the connection: %s", self.broker_url, reason_code)
                return
            log.info("connected to broker %s, following %s", self.broker_url, self.topic)
            client.subscribe(self.topic, qos=1)

        client.on_connect = on_connect
        route(client, self.topic, lambda message: self._on_model(bytes(message.payload)))
        client.connect_async(*self._broker)
        client.loop_start()
        self._client = client

    def stop(self) -> None:
        """Disconnect from the broker."""
        self._stop.set()
        if self._client is not None:
            self._client.disconnect()
            self._client.loop_stop()

    def take(self) -> OnnxModel | None:
        """The newest model loaded since the last call, or None."""
        if not self._ready.is_set():
            return None
        with self._lock:
            model, self._pending = self._pending, None
            self._ready.clear()
        return model

    def wait(self) -> OnnxModel | None:
        """Block until a model is loaded and return it; None if interrupted first."""
        log.info("waiting for a model announcement on %s at %s", self.topic, self.broker_url)
        try:
            while not self._ready.wait(0.5):
                pass
        except KeyboardInterrupt:
            return None
        return self.take()

    def _on_model(self, payload: bytes) -> None:
        """Download, check and load an announced model (on the MQTT thread); log and drop a bad one."""
        if not payload:
            return  # the retained announcement was cleared
        try:
            announcement = messages.decode(payload, ModelAnnouncement)
        except messages.ProtocolError as exc:
            log.warning("dropping malformed model announcement: %s", exc)
            return
        ref = announcement.onnx
        if ref is None:
            log.warning("round %d: ignoring it, it has no ONNX model", announcement.round)
            return
        if ref.sha256 == self._digest:
            return  # the retained announcement again, after a reconnect
        url = self.coordinator_url + ref.path
        try:
            data = fetch_blob(self.coordinator_url, ref, self._stop)
            model = load_model(data, url)
        except (Dropped, ValueError, ModelError) as exc:  # ValueError: weights.WeightsError, or a bad URL
            log.warning("round %d: ignoring its model: %s", announcement.round, exc)
            return
        log.info("downloaded %s (%d bytes) from %s", model.describe(), len(data), url)
        with self._lock:
            self._pending = model
            self._digest = ref.sha256
            self._ready.set()
