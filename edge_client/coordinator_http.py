"""The device's HTTP client: what the fleet learns, registration, token checks, acknowledgements, failure
reports and uploads, with retries; one request at a time goes through http_requests.
"""

import functools
import logging
import ssl
import threading
import time
from collections.abc import Callable

from fedspeech.edge_client.credentials import DeviceCredentials, Refused
from fedspeech.protocol import log_lines, message_checks, messages, routes, secure_sum_wire, signing, weights
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import (
    BlobRef,
    Credentials,
    ModelAnnouncement,
    Registration,
    Task,
    TaskFailure,
    TaskInfo,
)
from fedspeech.runtime.http_requests import (
    CONNECTION_ERRORS,
    Dropped,
    Reply,
    Unwanted,
    api_url,
    backoff,
    connection_error,
    error_reason,
    fetch_announcement,
    fetch_blob,
    request,
    says_revoked,
)

log = logging.getLogger(__name__)

MAX_SECURE_REPLY = secure_sum_wire.MAX_BODY_BYTES + 1  # one byte more shows a reply is too long
ENROLMENT = "with its enrolment secret"  # how a registration offered the secret, as its log line says


class CoordinatorClient:
    """The coordinator's HTTP API as one device uses it; every wait ends early when stop is set.

    credentials hold the device's token and the coordinator's pinned key; enrolment_secret is what the
    operator's `fedspeech devices add` printed, offered when the device has no token the coordinator takes,
    and secret_source where it came from, for the error that refuses it.
    """

    def __init__(
        self,
        base_url: str,
        device_id: str,
        stop: threading.Event,
        credentials: DeviceCredentials,
        enrolment_secret: str | None = None,
        context: ssl.SSLContext | None = None,
        secret_source: str = "--enrolment-secret-file",
    ) -> None:
        self.base_url, self.device_id, self.stop = base_url.rstrip("/"), device_id, stop
        self.credentials, self.enrolment_secret, self.context = credentials, enrolment_secret, context
        self.secret_source = secret_source

    def url(self, path: str) -> str:
        """The URL of an API path taken from a message; Dropped if the path is not one."""
        return api_url(self.base_url, path)

    def _until_answered(
        self, what: str, method: str, path: str, body: bytes | None = None, credential: str | None = None
    ) -> Reply | None:
        """Ask until the coordinator answers below 500 (asking again would not help); None if stopped."""
        headers = {"Content-Type": "application/json"} if body else {}
        if credential:
            headers["Authorization"] = f"Bearer {credential}"
        for attempt, delay in enumerate(backoff(), start=1):
            if self.stop.is_set():
                return None
            try:
                reply = request(method, self.url(path), body, headers, timeout=10.0, context=self.context)
                if reply.status < 500:
                    return reply
                reason = f"HTTP {reply.status}: {error_reason(reply)}"
            except CONNECTION_ERRORS as exc:
                reason = connection_error(exc)
            # a daemon waits for its coordinator, which may start after it or restart: one line a try
            log.warning(
                "%s to the coordinator at %s failed (%s); asking again in %.1f s (attempt %d)",
                what, self.base_url, reason, delay, attempt,
            )  # fmt: skip
            self.stop.wait(delay)
        return None

    def task_info(self) -> TaskInfo | None:
        """What the fleet learns and the model it trains; asked until answered, None if stopped first."""
        while (reply := self._until_answered("task request", "GET", routes.TASK)) is not None:
            if reply.status != 200:
                status, reason = f"HTTP {reply.status}", error_reason(reply)
                answer = status if reason == status else f"{status} ({reason})"
                raise Refused(
                    f"{self.base_url} answered GET {routes.TASK} with {answer}: is --coordinator the URL "
                    "of a fedspeech coordinator?"
                )
            try:
                return messages.decode(reply.body, TaskInfo)
            except ProtocolError as exc:
                log.warning("bad task description from the coordinator (%s); asking again", exc)
                self.stop.wait(5.0)
        return None

    def register(
        self, num_samples: int, profile: messages.Profile, test_counts: dict[str, int] | None = None
    ) -> bool:
        """Register, keep the new token and check the coordinator's key; False if stopped first.

        The kept token is offered first, then the enrolment secret, then nothing. Refused if the
        coordinator refuses them all, or names a key other than the pinned one. num_samples and
        test_counts bound what the coordinator counts of this device's updates and evaluations.
        """
        identity = signing.public_key_text(self.credentials.identity)
        registration = Registration(self.device_id, num_samples, profile, dict(test_counts or {}), identity)
        body = messages.encode(registration)
        offers = [(self.credentials.token, "with its kept token"), (self.enrolment_secret, ENROLMENT)]
        # last, nothing: a coordinator with open enrolment that forgot this device takes it as a new one
        offers = [(c, how) for c, how in offers if c] + [(None, "as a new device, with no token or secret")]
        revoked = secret_refused = False
        for credential, name in offers:
            if revoked and credential is None:
                break  # revoked: a new enrolment secret brings the device back, never registering as new
            answer = self._post_registration(body, credential)
            if answer is None:
                return False
            if isinstance(answer, Credentials):
                self.credentials.keep(answer, self.base_url)
                log.info("registered %s with %s (%d samples)", self.device_id, self.base_url, num_samples)
                return True
            revoked = revoked or says_revoked(answer)
            secret_refused = secret_refused or (name == ENROLMENT and answer.status == 401)
            reason = f"HTTP {answer.status}: {error_reason(answer)}"
            log.info("the coordinator refused to register %s %s (%s)", self.device_id, name, reason)
        if revoked:
            raise self.revoked()
        if secret_refused:
            raise self.secret_refused()
        message = (
            f"the coordinator at {self.base_url} refused to register {self.device_id} ({reason}). "
            f"Enrol it on the coordinator with `fedspeech devices add {self.device_id}` and start this "
            "device with --enrolment-secret-file FILE, FILE holding the secret that command prints"
        )
        log.warning("%s", message)
        raise Refused(message)

    def secret_refused(self) -> Refused:
        """The one line a device stops with when the coordinator refuses its enrolment secret.

        The coordinator answers a wrong secret as it answers an id it has not enrolled (asking tells no one
        which ids are enrolled): the line names both.
        """
        device = self.device_id
        return Refused(
            f"the coordinator at {self.base_url} refused to register {device} with its enrolment secret "
            f"(from {self.secret_source}): the secret is wrong, or {device} is not enrolled there. On the "
            f"coordinator, `fedspeech devices add {device}` prints a new one (`fedspeech devices revoke "
            f"{device}` first if it is enrolled already)"
        )

    def revoked(self) -> Refused:
        """The one line a revoked device stops with."""
        return Refused(
            f"the coordinator at {self.base_url} revoked {self.device_id}: enrol it again with `fedspeech "
            f"devices add {self.device_id}` and start it with --enrolment-secret-file FILE, FILE holding the "
            "secret that command prints"
        )

    def check_token(self, register: Callable[[], bool]) -> None:
        """Ask the coordinator once whether it still takes the token: Refused if it revoked this device.

        A plain 401 (a coordinator whose state was reset forgot the token) is answered by registering
        again; no answer at all waits for the next check.
        """
        if not self.credentials.token:
            return
        headers = {"Authorization": f"Bearer {self.credentials.token}"}
        try:
            reply = request(
                "GET", self.url(routes.device(self.device_id)), None, headers, 10.0, context=self.context
            )
        except CONNECTION_ERRORS as exc:
            log.debug("checking the token with the coordinator failed: %s", connection_error(exc))
            return
        if says_revoked(reply):
            raise self.revoked()
        if reply.status == 401:
            log.warning(
                "the coordinator no longer takes our token: %s; registering again", error_reason(reply)
            )
            register()

    def _post_registration(self, body: bytes, credential: str | None) -> Credentials | Reply | None:
        """The coordinator's credentials, or its refusal (a 401 or 403 reply); None if stopped first."""
        ask = functools.partial(
            self._until_answered, "registration", "POST", routes.DEVICES, body, credential
        )
        while (reply := ask()) is not None:
            if reply.status in (401, 403):
                return reply
            if reply.status != 200:
                raise Refused(f"the coordinator refused the registration: {error_reason(reply)}")
            try:
                return messages.decode(reply.body, Credentials)
            except ProtocolError as exc:
                log.warning("bad credentials from the coordinator (%s); registering again", exc)
                self.stop.wait(5.0)
        return None

    def fetch(self, ref: BlobRef) -> bytes:
        """A blob of the API, size and digest checked; retried a few times on connection errors."""
        return fetch_blob(self.base_url, ref, self.stop, self.context, self.credentials.token)

    def latest_announcement(self, topic: str) -> ModelAnnouncement | None:
        """The coordinator's latest announcement, signed by the pinned key for topic (fetch_announcement)."""
        if self.credentials.key is None:
            raise Dropped("no coordinator key pinned yet")
        return fetch_announcement(self.base_url, self.credentials.key, topic, self.context)

    def acknowledge(self, task: Task) -> None:
        """Tell the coordinator the device took the task; Dropped if it no longer wants it.

        An acknowledgement that does not get through is logged, and the task is done all the same: its round
        may have gone on without this device, and then refuses the result.
        """
        reply = self._post_once(routes.ack(task.task_id), b"", f"acknowledge task {task.task_id}")
        if reply is None:
            return
        if reply.status == 409:
            raise Unwanted(f"the coordinator no longer wants it: {error_reason(reply)}")
        if reply.status != 200:
            log.warning(
                "acknowledging task %s answered HTTP %d: %s", task.task_id, reply.status, error_reason(reply)
            )

    def report_failure(self, task: Task, reason: str) -> None:
        """Tell the coordinator, with the token, that the device could not do the task and why (escaped and
        cut to message_checks.MAX_FAILURE_CHARS): its round stops waiting for this device.

        Asked once: a report that does not get through is logged, and the round waits for this device as
        it would have.
        """
        short = log_lines.escape(reason)[: message_checks.MAX_FAILURE_CHARS] or "no reason given"
        body = messages.encode(TaskFailure(short))
        what = f"report that task {task.task_id} failed"
        try:
            reply = self._post_once(routes.failure(task.task_id), body, what, "application/json")
        except Dropped as exc:
            log.warning("could not %s: %s", what, exc)
            return
        if reply is None:
            return
        if reply.status == 200:
            log.info("reported to the coordinator that task %s failed", task.task_id)
        elif reply.status == 409:
            log.info("task %s failed after the coordinator stopped waiting for it", task.task_id)
        else:
            log.warning(
                "reporting that task %s failed answered HTTP %d: %s",
                task.task_id, reply.status, error_reason(reply),
            )  # fmt: skip

    def secure_sum(self, round: int, phase: str, body: bytes | None, deadline: float) -> bytes | None:
        """POST this device's message of a secure-sum phase (body), or GET the phase's outcome (None), with
        the token; connection errors and 5xx retried until deadline. The reply's body, None while the phase
        is still open. Unwanted when the round no longer wants this device, Dropped for other refusals.
        """
        url, method = self.url(routes.secure_sum(round, phase)), "GET" if body is None else "POST"
        delays = backoff()
        while not self.stop.is_set():
            headers = {"Authorization": f"Bearer {self.credentials.token}"}
            try:
                reply = request(method, url, body, headers, limit=MAX_SECURE_REPLY, context=self.context)
            except CONNECTION_ERRORS as exc:
                reason = connection_error(exc)
            else:
                if reply.status in (200, 202):
                    return reply.body if reply.status == 200 else None
                if reply.status == 409:
                    raise Unwanted(f"the {phase} phase of round {round}: {error_reason(reply)}")
                if reply.status < 500:
                    raise Dropped(
                        f"the {phase} phase of round {round}: HTTP {reply.status}: {error_reason(reply)}"
                    )
                reason = f"HTTP {reply.status}: {error_reason(reply)}"
            delay = next(delays)
            if time.time() + delay > deadline:
                raise Dropped(
                    f"the {phase} phase of round {round} failed ({reason}) and the deadline is near"
                )
            self.stop.wait(delay)
        raise Dropped("stopping")

    def _post_once(self, path: str, body: bytes, what: str, content_type: str | None = None) -> Reply | None:
        """POST body to path once, with the token; None, logged as 'could not <what>', if it does not get
        through; Dropped if path is not an API path.
        """
        headers = {"Authorization": f"Bearer {self.credentials.token}"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        url = self.url(path)
        try:
            return request("POST", url, body, headers, timeout=10.0, context=self.context)
        except CONNECTION_ERRORS as exc:
            log.warning("could not %s: %s", what, connection_error(exc))
            return None

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
                "Authorization": f"Bearer {self.credentials.token}",
                "Content-Type": content_type,
                "X-Content-SHA256": weights.sha256(body),
            }
            try:
                reply = request("POST", url, body, headers, context=self.context)
            except CONNECTION_ERRORS as exc:
                reason = str(exc)
            else:
                if reply.status == 200:
                    return
                if says_revoked(reply):
                    raise self.revoked()
                if reply.status == 401 and not registered_again:
                    log.warning(
                        "the coordinator refused our token: %s; registering again", error_reason(reply)
                    )
                    registered_again = True
                    if not register():
                        raise Dropped("stopped while registering again")
                    continue
                if reply.status == 409:
                    raise Unwanted(f"the coordinator no longer wants it: {error_reason(reply)}")
                if reply.status < 500:
                    raise Dropped(f"upload rejected with HTTP {reply.status}: {error_reason(reply)}")
                reason = f"HTTP {reply.status}: {error_reason(reply)}"
            delay = next(delays)
            if time.time() + delay > deadline:
                raise Dropped(f"upload failed ({reason}) and the deadline is near")
            log.info("upload to %s failed (%s); retrying in %.1f s", url, reason, delay)
            self.stop.wait(delay)
