"""The device's HTTP side: what the fleet learns, registration, blob downloads and uploads, with retries."""

import http.client
import json
import logging
import random
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fedspeech.protocol import messages, routes, weights
from fedspeech.protocol.messages import BlobRef, Credentials, Registration, TaskInfo

log = logging.getLogger(__name__)

DOWNLOAD_ATTEMPTS = 4
HTTP_TIMEOUT = 60.0
MAX_ERROR_BYTES = 4096  # of an error reply read when the body is limited: enough for the coordinator's error
# a path from a message may only name a resource of the coordinator's API, never another host or port
_API_PATH = re.compile(rf"^{routes.PREFIX}/[A-Za-z0-9_./-]{{1,200}}$")
_BLOB_PATH = re.compile(r"^/[A-Za-z0-9_./-]{1,200}$")  # any path, but on the coordinator's host and port
_CONNECTION_ERRORS = (OSError, http.client.HTTPException)


class Dropped(Exception):
    """The current task cannot be done; the text says why."""


@dataclass
class Reply:
    """An HTTP status and body."""

    status: int
    body: bytes


def request(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = HTTP_TIMEOUT,
    limit: int | None = None,
) -> Reply:
    """One HTTP request; any status is a reply, connection problems raise OSError or HTTPException.

    With a limit, at most limit bytes of the body are read (of an error's, MAX_ERROR_BYTES if more).
    """
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return Reply(response.status, response.read() if limit is None else response.read(limit))
    except urllib.error.HTTPError as exc:
        with exc:
            return Reply(exc.code, exc.read() if limit is None else exc.read(max(limit, MAX_ERROR_BYTES)))


def backoff(first: float = 0.5, maximum: float = 10.0) -> Iterator[float]:
    """Delays doubling from first up to maximum, each with random jitter so devices do not retry in step."""
    delay = first
    while True:
        yield random.uniform(delay / 2, delay)
        delay = min(delay * 2, maximum)


def error_reason(reply: Reply) -> str:
    """The coordinator's error text from a reply, or its status."""
    try:
        return str(json.loads(reply.body)["error"])
    except (ValueError, KeyError, TypeError):
        return reply.body[:200].decode(errors="replace") or f"HTTP {reply.status}"


def fetch_blob(base_url: str, ref: BlobRef, stop: threading.Event | None = None) -> bytes:
    """GET ref.path from base_url: at most ref.size bytes, sha256 checked, retried on connection errors.

    Dropped if it cannot be downloaded, weights.WeightsError if what came is not the blob ref announces.
    No token is sent: the coordinator serves its blobs to anyone, so a listening device can fetch them too.
    """
    if not _BLOB_PATH.match(ref.path) or ".." in ref.path:
        raise Dropped(f"refusing the path {ref.path[:80]!r}: not a path on the coordinator")
    stop = stop or threading.Event()
    url = base_url.rstrip("/") + ref.path
    for attempt, delay in enumerate(backoff(), start=1):
        try:
            reply = request("GET", url, limit=max(0, ref.size) + 1)
            break
        except _CONNECTION_ERRORS as exc:
            if attempt == DOWNLOAD_ATTEMPTS or stop.is_set():
                raise Dropped(f"cannot download {url}: {exc}") from None
            log.info("download attempt %d of %s failed (%s); retrying in %.1f s", attempt, url, exc, delay)
            stop.wait(delay)
    if reply.status != 200:
        raise Dropped(f"download of {url} answered HTTP {reply.status}: {error_reason(reply)}")
    if len(reply.body) != ref.size:
        more = " or more" if len(reply.body) > ref.size else ""
        raise weights.WeightsError(f"size mismatch: got {len(reply.body)} bytes{more}, expected {ref.size}")
    weights.check_digest(reply.body, ref.sha256)
    return reply.body


class CoordinatorClient:
    """The coordinator's HTTP API as one device uses it; every wait ends early when stop is set."""

    def __init__(self, base_url: str, device_id: str, stop: threading.Event) -> None:
        self.base_url, self.device_id, self.stop = base_url.rstrip("/"), device_id, stop
        self.token = ""

    def url(self, path: str) -> str:
        """The URL of an API path taken from a message; Dropped if the path is not one."""
        if not _API_PATH.match(path) or ".." in path:
            raise Dropped(f"refusing the path {path[:80]!r}: not a path of the coordinator's API")
        return self.base_url + path

    def _until_answered(self, what: str, method: str, path: str, body: bytes | None = None) -> Reply | None:
        """Ask until the coordinator answers 2xx; None if stopped first, RuntimeError on a 4xx."""
        headers = {"Content-Type": "application/json"} if body else {}
        for attempt, delay in enumerate(backoff(), start=1):
            if self.stop.is_set():
                return None
            try:
                reply = request(method, self.base_url + path, body, headers, timeout=10.0)
                if reply.status == 200:
                    return reply
                if 400 <= reply.status < 500:  # asking again will not change the answer
                    raise RuntimeError(f"the coordinator refused the {what}: {error_reason(reply)}")
                reason = f"HTTP {reply.status}: {error_reason(reply)}"
            except _CONNECTION_ERRORS as exc:
                reason = str(exc)
            log.info("%s attempt %d failed (%s); retrying in %.1f s", what, attempt, reason, delay)
            self.stop.wait(delay)
        return None

    def task_info(self) -> TaskInfo | None:
        """What the fleet learns and the model it trains; asked until answered, None if stopped first."""
        while (reply := self._until_answered("task request", "GET", routes.TASK)) is not None:
            try:
                return messages.decode(reply.body, TaskInfo)
            except messages.ProtocolError as exc:
                log.warning("bad task description from the coordinator (%s); asking again", exc)
                self.stop.wait(5.0)
        return None

    def register(self, num_samples: int, profile: messages.Profile) -> bool:
        """Register until the coordinator answers and keep the token; False if stopped first."""
        body = messages.encode(Registration(self.device_id, num_samples, profile))
        while (reply := self._until_answered("registration", "POST", routes.DEVICES, body)) is not None:
            try:
                self.token = messages.decode(reply.body, Credentials).token
            except messages.ProtocolError as exc:
                log.warning("bad credentials from the coordinator (%s); registering again", exc)
                self.stop.wait(5.0)
                continue
            log.info("registered %s with %s (%d samples)", self.device_id, self.base_url, num_samples)
            return True
        return False

    def fetch(self, ref: BlobRef) -> bytes:
        """A blob of the API, size and digest checked; retried a few times on connection errors."""
        self.url(ref.path)  # Dropped for a path outside the API
        return fetch_blob(self.base_url, ref, self.stop)

    def upload(
        self, path: str, body: bytes, content_type: str, deadline: float, register: Callable[[], bool]
    ) -> None:
        """Post a result with the token; on 401 call register once, retry connection errors until deadline."""
        url = self.url(path)
        registered_again = False
        delays = backoff()
        while True:
            if self.stop.is_set():
                raise Dropped("stopping")
            headers = {
                "Authorization": f"Bearer {self.token}",
                "Content-Type": content_type,
                "X-Content-SHA256": weights.sha256(body),
            }
            try:
                reply = request("POST", url, body, headers)
            except _CONNECTION_ERRORS as exc:
                reason = str(exc)
            else:
                if reply.status == 200:
                    return
                if reply.status == 401 and not registered_again:
                    log.info("the coordinator does not know our token; registering again")
                    registered_again = True
                    if not register():
                        raise Dropped("stopped while registering again")
                    continue
                if reply.status == 409:
                    raise Dropped(f"the coordinator no longer wants it: {error_reason(reply)}")
                if reply.status < 500:
                    raise Dropped(f"upload rejected with HTTP {reply.status}: {error_reason(reply)}")
                reason = f"HTTP {reply.status}: {error_reason(reply)}"
            delay = next(delays)
            if time.time() + delay > deadline:
                raise Dropped(f"upload failed ({reason}) and the deadline is near")
            log.info("upload to %s failed (%s); retrying in %.1f s", url, reason, delay)
            self.stop.wait(delay)
