"""One request to the coordinator over HTTP(S): a TLS context, backoff between retries, the text of an
error, and checked downloads of blobs and of the latest model announcement.
"""

import http.client
import json
import logging
import random
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedspeech.protocol import bounds, log_lines, messages, routes, signing, weights
from fedspeech.protocol.messages import BlobRef, ModelAnnouncement

log = logging.getLogger(__name__)

DOWNLOAD_ATTEMPTS = 4
HTTP_TIMEOUT = 60.0
MAX_REPLY_BYTES = messages.MAX_MESSAGE_BYTES + 1  # of a JSON reply: one byte more shows it is too long
MAX_ERROR_BYTES = 4096  # of an error reply: enough for the coordinator's error
CONNECTION_ERRORS = (OSError, http.client.HTTPException)


class Dropped(Exception):
    """The current task cannot be done; the text says why."""


class Unwanted(Dropped):
    """The current task is no longer wanted (withdrawn, its deadline passed, its round closed): there is
    nothing to tell the coordinator.
    """


@dataclass
class Reply:
    """An HTTP status and body."""

    status: int
    body: bytes


def https_context(ca_file: Path | None) -> ssl.SSLContext | None:
    """TLS settings trusting ca_file (a coordinator with a private CA's certificate); None: the system's CAs.

    ValueError if ca_file is not a usable CA certificate.
    """
    if ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot use {ca_file} as the coordinator's CA: {exc}") from None


def request(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = HTTP_TIMEOUT,
    limit: int = MAX_REPLY_BYTES,
    context: ssl.SSLContext | None = None,
) -> Reply:
    """One HTTP(S) request; any status is a reply, connection problems raise OSError or HTTPException.

    At most limit bytes of the body are read (of an error's, MAX_ERROR_BYTES).
    """
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as response:
            return Reply(response.status, response.read(limit))
    except urllib.error.HTTPError as exc:
        with exc:
            return Reply(exc.code, exc.read(MAX_ERROR_BYTES))


def backoff(first: float = 0.5, maximum: float = 10.0) -> Iterator[float]:
    """Delays doubling from first up to maximum, each with random jitter so devices do not retry in step."""
    delay = first
    while True:
        yield random.uniform(delay / 2, delay)
        delay = min(delay * 2, maximum)


def connection_error(exc: Exception) -> str:
    """Why a request got no answer, in a few words: urllib's reason without its wrapping."""
    reason = getattr(exc, "reason", exc)  # urllib.error.URLError wraps the socket's or TLS' error
    if isinstance(reason, OSError) and not isinstance(reason, ssl.SSLError) and reason.strerror:
        return reason.strerror.lower()
    return str(reason)


def error_reason(reply: Reply) -> str:
    """The coordinator's error text from a reply, or its status; control characters escaped (one line).

    A web page (what a server that is no coordinator answers) is named as one, never printed.
    """
    try:
        reason = str(json.loads(reply.body)["error"])[:200]
    except (ValueError, KeyError, TypeError):
        reason = reply.body[:200].decode(errors="replace").strip() or f"HTTP {reply.status}"
        if looks_like_a_page(reply.body):
            reason = f"HTTP {reply.status} with a web page, not a fedspeech coordinator's answer"
    return log_lines.escape(reason)


def looks_like_a_page(body: bytes) -> bool:
    """Whether a reply's body is HTML: a web server's page where a coordinator's JSON was expected."""
    return (
        body.lstrip()[:256].lower().startswith((b"<!doctype html", b"<html", b"<head", b"<body", b"<title"))
    )


def says_revoked(reply: Reply) -> bool:
    """Whether the coordinator answered that the token sent was this device's when it was revoked."""
    try:
        return reply.status == 401 and json.loads(reply.body).get("revoked") is True
    except (ValueError, AttributeError):
        return False


def api_url(base_url: str, path: str) -> str:
    """The URL of an API path taken from a message; Dropped if it would leave the coordinator's API."""
    try:
        return routes.url(base_url, path)
    except ValueError:
        raise Dropped(f"refusing the path {path[:80]!r}: not a path of the coordinator's API") from None


def fetch_blob(
    base_url: str,
    ref: BlobRef,
    stop: threading.Event | None = None,
    context: ssl.SSLContext | None = None,
    token: str | None = None,
) -> bytes:
    """GET ref.path from base_url: at most ref.size + 1 bytes, size and sha256 checked, retried on errors.

    Dropped if it cannot be downloaded, weights.WeightsError if what came is not the blob ref announces.
    The coordinator serves its models to anyone, so a listening device can fetch them without a token;
    an update relayed to the next device of a group goes only to that device, which sends its token.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else None
    url = api_url(base_url, ref.path)
    if not 0 < ref.size <= bounds.MAX_BLOB_BYTES:
        raise Dropped(f"refusing a blob of {ref.size} bytes (at most {bounds.MAX_BLOB_BYTES})")
    stop = stop or threading.Event()
    for attempt, delay in enumerate(backoff(), start=1):
        try:
            reply = request("GET", url, headers=headers, limit=ref.size + 1, context=context)  # +1: too long
            break
        except CONNECTION_ERRORS as exc:
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


def fetch_announcement(
    base_url: str, key: Ed25519PublicKey, topic: str, context: ssl.SSLContext | None = None
) -> ModelAnnouncement | None:
    """The coordinator's latest model announcement, asked over HTTP(S) and checked as if it came on topic.

    None if it has announced none yet; Dropped if it cannot be asked, ProtocolError if the answer is not an
    announcement signed by key for topic.
    """
    url = routes.url(base_url, routes.ANNOUNCEMENT)
    try:
        reply = request("GET", url, timeout=10.0, limit=signing.MAX_SIGNED_BYTES + 1, context=context)
    except CONNECTION_ERRORS as exc:
        raise Dropped(f"cannot ask {url}: {connection_error(exc)}") from None
    if reply.status == 404:
        return None
    if reply.status != 200:
        raise Dropped(f"{url} answered HTTP {reply.status}: {error_reason(reply)}")
    return messages.decode(signing.verify(key, topic, reply.body), ModelAnnouncement)
