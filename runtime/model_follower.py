"""Follows the coordinator's retained model announcement and loads each new ONNX model it announces.

Torch-free. An announcement counts only if the coordinator's key signed it and its round is newer than
the model loaded and not below the floor, the newest round seen announced, kept in the state folder across
restarts (an old announcement replayed is ignored). Before it loads a model announced on the broker, whose
retained message anyone on an open broker may have replaced or cleared, and after each reconnection, the
follower asks the coordinator for its latest announcement over HTTP(S), signed by the same key. Until it
has a model it asks again every few seconds (a bounded backoff), so that it takes the coordinator's first
model even if the broker's message never reaches it, and says why it waits, once each time the reason
changes: the coordinator does not answer, has announced no model yet, or the announcement retained on the
broker is signed by another key (another coordinator on the same topic root). Each model is downloaded on
a thread of the follower's own (its size and sha256 checked, as the device daemon does; its two graphs,
front-end and classifier, where the announcement names them, else its one file) and loaded, then
handed over: `model` is the newest, which each listener swaps in between two frames, so no audio is
dropped. A model that cannot be downloaded, does not match its announcement or does not load is logged,
the current one kept, and tried again RETRY_S later unless a newer one is announced.
"""

import http.client
import json
import logging
import threading
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedspeech.protocol import messages, routes, signing
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import BlobRef, ModelAnnouncement
from fedspeech.protocol.mqtt import BrokerSettings, add_on_connect, connect, make_client, route
from fedspeech.protocol.topics import DEFAULT_ROOT, Topics
from fedspeech.runtime.announcements import FLOOR_FILE, Floor, worth_fetching
from fedspeech.runtime.http_requests import (
    Dropped,
    backoff,
    connection_error,
    error_reason,
    fetch_announcement,
    fetch_blob,
    https_context,
    looks_like_a_page,
    request,
)
from fedspeech.runtime.session import ModelError, OnnxModel, PairedModel, load_model, load_pair

log = logging.getLogger(__name__)

KEY_ATTEMPTS = 5
RETRY_S = 30.0  # between two attempts at a model that could not be downloaded or loaded
ASK_EVERY_S = 10.0  # at most, between two questions to the coordinator while no model is held


class ModelFollower:
    """The newest announced model, loaded in the background.

    coordinator_key (base64) is the key announcements must be signed with; without it, start fetches
    the coordinator's own. state_dir keeps the floor across restarts (None: in memory only). client: a
    client of broker's that other parts of the process share (one login, one last will), which its owner
    connects after start, else the follower makes and connects its own. ValueError for settings that
    cannot work (broker, CA, key).
    """

    def __init__(
        self,
        coordinator_url: str,
        broker: BrokerSettings,
        topic_root: str = DEFAULT_ROOT,
        coordinator_key: str | None = None,
        coordinator_ca: Path | None = None,
        state_dir: Path | None = None,
        client: mqtt.Client | None = None,
    ) -> None:
        broker.check()
        self.coordinator_url = coordinator_url.rstrip("/")
        routes.url(self.coordinator_url, routes.KEY)  # ValueError for a URL that is not a coordinator's
        self.broker = broker
        self.topic = Topics(topic_root).model
        self._context = https_context(coordinator_ca)
        self._key: Ed25519PublicKey | None = None
        if coordinator_key is not None:
            self._key = signing.parse_public_key(coordinator_key)
        self._floor_path = state_dir / FLOOR_FILE if state_dir is not None else None
        self._floor = Floor(None, "", self.topic)  # the coordinator's, once its key is known
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._ask = threading.Event()  # ask the coordinator for its latest announcement
        self._wake = threading.Event()  # a newer model is wanted, the coordinator is to be asked, or stop
        self._stop = threading.Event()  # ends the worker and a download's retries
        self._model: OnnxModel | None = None  # the newest model loaded
        self._round = -1  # of the newest model loaded
        self._wanted: ModelAnnouncement | None = None  # newer than it, not loaded yet
        self._client = client  # a client shared with other parts of the process, which connects it
        self._owns_client = client is None
        self._key_origin = "pinned with --coordinator-key" if coordinator_key else "sent by the coordinator"
        self._latest: ModelAnnouncement | None = None  # the coordinator's, as last asked (offered once)
        self._said = ""  # why no model can be had from the coordinator, as last logged (once per change)
        self._foreign_said = False  # whether a retained announcement signed by another key was logged

    def start(self) -> None:
        """Connect to the broker (reconnecting by itself), follow the announcement; ValueError if no key."""
        if self._key is None:
            self._key = self._fetch_key()
        self._floor = Floor(self._floor_path, signing.public_key_text(self._key), self.topic)
        self._ask.set()  # before anything retained on the broker is trusted
        if self._client is None:
            self._client = make_client(self.broker, f"fedspeech-listen-{uuid.uuid4().hex[:8]}")

        def on_connect(client: mqtt.Client) -> None:
            log.info("connected to broker %s, following %s", self.broker.url, self.topic)
            client.subscribe(self.topic, qos=1)
            self._ask.set()  # what the broker retains may have been replaced while this listener was away
            self._wake.set()

        add_on_connect(self._client, on_connect)
        route(self._client, self.topic, lambda message: self._on_model(bytes(message.payload)))
        threading.Thread(target=self._follow, name="model-follower", daemon=True).start()
        if self._owns_client:
            connect(self._client, self.broker)

    def _fetch_key(self) -> Ed25519PublicKey:
        """The coordinator's signing key, asked for over HTTP(S), trusted as it comes; ValueError if none."""
        url = routes.url(self.coordinator_url, routes.KEY)
        for attempt, delay in enumerate(backoff(), start=1):
            try:
                reply = request("GET", url, timeout=10.0, context=self._context)
                break
            except (OSError, http.client.HTTPException) as exc:  # the coordinator is not up yet, maybe
                if attempt == KEY_ATTEMPTS or self._stop.is_set():
                    raise ValueError(
                        f"cannot get the coordinator's key from {url}: {connection_error(exc)}; start the "
                        "coordinator first, or give its key with --coordinator-key to wait for it"
                    ) from None
                log.info(
                    "asking %s for its key failed (%s); again in %.1f s", url, connection_error(exc), delay
                )
                self._stop.wait(delay)
        if reply.status != 200:
            raise ValueError(f"cannot get the coordinator's key: {url} answered {error_reason(reply)}")
        text = _key_text(reply.body)
        key = signing.parse_public_key(text)
        self._key_origin = f"sent by {url}"
        log.warning(
            "trusting the key %s that %s sent: pin it with --coordinator-key %s so that an impostor "
            "cannot hand this listener its models",
            text, url, text,
        )  # fmt: skip
        return key

    def stop(self) -> None:
        """Disconnect from the broker and end the downloads."""
        self._stop.set()
        self._wake.set()
        if self._client is not None and self._owns_client:
            self._client.disconnect()
            self._client.loop_stop()

    @property
    def model(self) -> OnnxModel | None:
        """The newest model loaded, or None before the first; each listener swaps it in when it changes."""
        return self._model

    def wait(self, timeout: float | None = None) -> OnnxModel | None:
        """Block until a model is loaded (at most timeout seconds) and return it; None if there is none
        by then, or if interrupted first.
        """
        log.info("waiting for a model announcement on %s at %s", self.topic, self.broker.url)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._ready.wait(0.5):
                if deadline is not None and time.monotonic() >= deadline:
                    return None
        except KeyboardInterrupt:
            return None
        return self._model

    def _on_model(self, payload: bytes) -> None:
        """Note a signed announcement of a newer model (on the MQTT thread); log and drop anything else."""
        if not payload or self._key is None:
            return  # the retained announcement was cleared
        try:
            body = signing.verify(self._key, self.topic, payload)
            announcement = messages.decode(body, ModelAnnouncement)
        except signing.BadSignature:
            self._signed_by_another_key()
            return
        except ProtocolError as exc:
            log.warning("dropping a model announcement: %s", exc)
            return
        self._foreign_said = False
        self._offer(announcement)

    def _signed_by_another_key(self) -> None:
        """Say once, until a genuine announcement comes, that the broker's is another coordinator's."""
        if self._foreign_said:
            return
        self._foreign_said = True
        assert self._key is not None
        log.warning(
            "the retained announcement on %s has a bad signature: it is signed by another key than the "
            "coordinator's (%s): the broker %s carries another coordinator's models. If --coordinator "
            "names the wrong one, give it the URL of the coordinator that announces on this broker; if two "
            "coordinators share the broker, give each its own --topic-root, and this listener its "
            "coordinator's. This listener runs only models signed by its coordinator: waiting for a model "
            "signed by %s",
            self.topic, self._key_origin, self.broker.url, signing.public_key_text(self._key),
        )  # fmt: skip

    def _offer(self, announcement: ModelAnnouncement) -> None:
        """Want a verified announcement's model if it is newer than any held, wanted or seen (the floor)."""
        with self._lock:
            if not worth_fetching(announcement, self._round, self._wanted, self._floor):
                return
            self._wanted = announcement
        self._wake.set()

    def _ask_latest(self) -> None:
        """Offer the coordinator's latest announcement, asked over HTTP(S), unless offered already; log why
        there is none, once per reason.
        """
        assert self._key is not None
        url, waiting = self.coordinator_url, self._round < 0
        try:
            latest = fetch_announcement(url, self._key, self.topic, self._context)
        except Dropped as exc:
            if waiting:
                self._say(logging.WARNING, f"no model yet: {exc}; asking again until the coordinator answers")
            else:
                self._say(logging.WARNING, f"cannot check the coordinator's latest model: {exc}")
            return
        except ProtocolError as exc:
            self._say(
                logging.WARNING,
                f"{'no model yet: ' if waiting else ''}the latest announcement of the coordinator at {url} "
                f"does not check ({exc}): is this listener's --topic-root the coordinator's, and "
                "--coordinator-key its key?",
            )
            return
        if latest is None:
            if waiting:
                none = f"the coordinator at {url} has announced none yet; asking it again every few seconds"
                self._say(logging.INFO, f"no model yet: {none}")
            return
        self._said = ""
        if latest != self._latest:  # asked again while no model is held: offered (and logged) once
            self._latest = latest
            self._offer(latest)

    def _say(self, level: int, line: str) -> None:
        """Log line unless it is what was said last."""
        if line != self._said:
            self._said = line
            log.log(level, "%s", line)

    def _follow(self) -> None:
        """Ask the coordinator when due (every few seconds while no model is held), then download and load
        each wanted model (on the follower's thread), until stopped.
        """
        delays = backoff(maximum=ASK_EVERY_S)  # between two questions while no model is held
        failed, retry_at = None, 0.0  # the wanted model that could not be had, and when to try it again
        while not self._stop.is_set():
            if self._ask.is_set() or self._round < 0:
                self._ask.clear()
                self._ask_latest()
            with self._lock:
                wanted = self._wanted
            if wanted is not None and (wanted is not failed or time.monotonic() >= retry_at):
                if self._load(wanted):
                    continue
                failed, retry_at = wanted, time.monotonic() + RETRY_S
            if self._round < 0:
                timeout: float | None = next(delays)
            elif wanted is not None:
                timeout = max(0.0, retry_at - time.monotonic())
            else:
                timeout = None
            self._wake.wait(timeout)
            self._wake.clear()

    def _load(self, announcement: ModelAnnouncement) -> bool:
        """Download, check and load an announced model and hand it over; False (logged) if it cannot be.

        Where the announcement names the model's two graphs, the pair is taken (its front-end then runs on
        new frames only); a pair that cannot be had leaves the one file to take.
        """
        assert announcement.onnx is not None
        model: OnnxModel | None = self._load_pair(announcement)
        if model is None:
            ref = announcement.onnx
            try:
                data = self._fetch(ref)
                model = load_model(data, self.coordinator_url + ref.path)
            except (Dropped, ValueError, ModelError) as exc:  # ValueError: weights.WeightsError
                log.warning("round %d: ignoring its model: %s", announcement.round, exc)
                return False
            log.info("downloaded %s (%d bytes) from %s", model.describe(), len(data), ref.path)
        with self._lock:
            self._model, self._round = model, announcement.round
            if self._wanted is announcement:
                self._wanted = None
            self._ready.set()
        return True

    def _fetch(self, ref: BlobRef) -> bytes:
        """A blob of the coordinator's, its size and sha256 checked."""
        return fetch_blob(self.coordinator_url, ref, self._stop, self._context)

    def _load_pair(self, announcement: ModelAnnouncement) -> PairedModel | None:
        """The announced model's two graphs, downloaded (size and sha256 checked) and loaded; None if it
        names none, or (logged) if they cannot be had.
        """
        if announcement.frontend is None or announcement.classifier is None:
            return None
        refs = (announcement.frontend, announcement.classifier)
        try:
            frontend, classifier = (self._fetch(ref) for ref in refs)
            model = load_pair(frontend, classifier, f"{self.coordinator_url}{refs[1].path}")
        except (Dropped, ValueError, ModelError) as exc:  # ValueError: weights.WeightsError
            log.warning("round %d: taking its one ONNX file, not its two graphs: %s", announcement.round, exc)
            return None
        log.info(
            "downloaded %s as its front-end (%d bytes) and classifier (%d bytes) from %s and %s",
            model.describe(), len(frontend), len(classifier), refs[0].path, refs[1].path,
        )  # fmt: skip
        return model


def _key_text(body: bytes) -> str:
    """The key in GET /api/key's reply {"coordinator_key": "<base64>"}; ValueError if there is none."""
    try:
        text = json.loads(body)["coordinator_key"]
    except (ValueError, KeyError, TypeError):
        text = None
    if not isinstance(text, str):
        if looks_like_a_page(body):
            raise ValueError(f"{routes.KEY} answered a web page: the URL is not a fedspeech coordinator's")
        raise ValueError(f'{routes.KEY} answered no {{"coordinator_key": ...}}: {body[:80]!r}')
    return text
