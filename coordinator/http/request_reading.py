"""The HTTP server's requests: each read whole, within its deadline and the body budget, before a worker
thread runs the Flask app on it; each answer sent back by the event loop, not by a worker.

Until a request is whole it costs a coroutine and its connection, never a worker thread: a client that
sends slowly, or not at all, is closed at its deadline (http_timeout seconds after its connection became
ready, headers and body together) having held nothing else. Its body is weighed before it is read: a declared
length over the largest route's limit is refused at once; the route's rule (body_rules) checks the token
and the task and sets the limit, and may check the first bytes before the rest is read. The bodies held
at once are bounded by the budget. A refusal is sent at once; a body of declared length up to DRAIN_BYTES
is then read and dropped, within the deadline, so that a client that sends its whole body before it reads
gets the answer; a longer or chunked one is not read on: the connection is closed.
"""

import asyncio
import contextlib
import io
import json
import logging
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Response
from werkzeug.wsgi import FileWrapper

from fedspeech.coordinator.http.body_rules import BodyRule, Rules, admit
from fedspeech.coordinator.http.listening_socket import Listener
from fedspeech.protocol.bounds import MAX_BLOB_BYTES

log = logging.getLogger(__name__)

MAX_BODY_BYTES = MAX_BLOB_BYTES  # the largest route's limit: a longer declared body is refused unread
# a refused body of declared length up to this is read and dropped, so that a client that sends all of it
# before it reads (as urllib does) sees the refusal; a longer one would cost the event loop its reading
DRAIN_BYTES = 16 * 1024 * 1024
_PIECE = 64 * 1024  # bytes of a file sent at a time
# what a client still sending a refused body has to read the refusal before its connection is closed (and
# reset, on the bytes left unread): on a loaded two-core machine, one of a burst of refused uploads got
# no answer when the close followed the refusal at once
LINGER_S = 1.0

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
Spawn = Callable[..., Awaitable[Any]]  # runs a function on a worker thread


class _FileAnswer(FileWrapper):
    """A file the app answers with (Flask's send_file): the event loop sends it, not a worker."""


@dataclass
class _Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes | _FileAnswer = b""


@dataclass
class _Refused(Exception):
    """A request answered before it is whole: by the server itself, or by its route's rule."""

    answer: _Answer
    reason: str = field(default="")


def _json_answer(status: int, reason: str, *headers: tuple[bytes, bytes]) -> _Answer:
    body = json.dumps({"error": reason}).encode()
    length = str(len(body)).encode()
    kind = (b"content-type", b"application/json")
    return _Answer(status, [kind, (b"content-length", length), *headers], body)


def _flask_answer(response: Response) -> _Answer:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.to_wsgi_list()]
    return _Answer(response.status_code, headers, response.get_data())


class _Incoming:
    """A request's body as it arrives, a piece at a time."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.done = False  # whole, or the client went away
        self.gone = False

    async def piece(self) -> bytes:
        """The next piece of the body; b"" once it is done."""
        if self.done:
            return b""
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.done = self.gone = True
            return b""
        self.done = not message.get("more_body", False)
        return message.get("body", b"")


class Bridge:
    """The server's ASGI side (hypercorn's app): requests in whole, the WSGI app on a worker, answers out."""

    def __init__(
        self, app: Flask, rules: Rules, listener: Listener, *, timeout_s: float, body_budget: int
    ) -> None:
        self.app, self.rules, self.listener = app, rules, listener
        self.timeout_s = timeout_s
        self.budget = body_budget  # bytes of bodies that may still be taken; only the event loop uses it

    async def __call__(
        self, scope: Any, receive: Receive, send: Send, sync_spawn: Spawn, call_soon: Any
    ) -> None:
        """Handle one request (or the server's start and stop)."""
        if scope["type"] == "http":
            await self._request(scope, receive, send, sync_spawn)
            self.listener.ready(scope.get("client"))
        elif scope["type"] == "lifespan":
            await _lifespan(receive, send)
        else:  # a WebSocket: this API has none
            await send({"type": "websocket.close"})

    async def _request(self, scope: Any, receive: Receive, send: Send, spawn: Spawn) -> None:
        environ, incoming = _environ(scope), _Incoming(receive)
        declared = _declared_length(scope["headers"])
        loop = asyncio.get_running_loop()
        deadline = self.listener.ready_since(scope.get("client"), loop.time()) + self.timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                body, reserved = await self._arrive(environ, declared, incoming)
        except _Refused as refused:
            _log_refusal(environ, refused)
            drain = declared is not None and declared <= DRAIN_BYTES
            await _refuse(refused.answer, incoming, send, deadline if drain else None)
            return
        except TimeoutError:
            reason = f"the request did not arrive within {self.timeout_s:g} s"
            _log_refusal(environ, _Refused(_json_answer(408, reason), reason), logging.INFO)
            await _refuse(_json_answer(408, reason), incoming, send, None, linger=False)  # it sends slowly
            return
        if incoming.gone:  # a device killed mid-upload: nothing of it reaches the app
            self.budget += reserved
            log.warning("%s %r from %s: the client went away after %d of %s bytes; nothing was taken",
                        environ["REQUEST_METHOD"], environ["PATH_INFO"], environ["REMOTE_ADDR"], len(body),
                        declared if declared is not None else "unknown")  # fmt: skip
            return
        try:
            answer = await spawn(self._call_app, environ, body)
        finally:
            self.budget += reserved
        try:
            async with asyncio.timeout(self.timeout_s):
                await _send(answer, send)
        except TimeoutError:
            log.info("%s %r: the answer was not read within %g s", environ["REQUEST_METHOD"],
                     environ["PATH_INFO"], self.timeout_s)  # fmt: skip
        finally:
            if isinstance(answer.body, _FileAnswer):
                answer.body.close()

    async def _arrive(
        self, environ: dict[str, Any], declared: int | None, incoming: _Incoming
    ) -> tuple[bytes, int]:
        """The request's body, read whole, and the bytes of the budget it holds; _Refused if it is not
        taken.
        """
        if environ["SERVER_PROTOCOL"] not in ("HTTP/1.0", "HTTP/1.1"):
            raise _Refused(_json_answer(505, "HTTP/1.1 only"), "HTTP/1.1 only")
        if declared is not None and declared > MAX_BODY_BYTES:
            reason = f"a body of {declared} bytes; at most {MAX_BODY_BYTES} are taken"
            raise _Refused(_json_answer(413, reason), reason)
        rule = BodyRule(0)
        if declared != 0:  # a body is coming: its route's rule first
            # on the event loop: a rule takes a fraction of a millisecond (a token looked up in the store,
            # whose reads wait only for a writer's commit; the Uploads lock, held briefly), less than handing
            # it to a thread and back, which under a burst costs each request its turn for the interpreter
            admitted = admit(self.app, environ, self.rules)
            if isinstance(admitted, Response):
                raise _Refused(_flask_answer(admitted))
            rule = admitted
        if declared is not None and declared > rule.limit:
            reason = f"a body of {declared} bytes; at most {rule.limit} are taken here"
            raise _Refused(_json_answer(413, reason), reason)
        reserved = rule.limit if declared is None else declared
        if reserved > self.budget:
            reason = "busy with other uploads: try again shortly"
            raise _Refused(_json_answer(503, reason, (b"retry-after", b"1")), reason)
        self.budget -= reserved
        try:
            return await _read(incoming, rule), reserved
        except BaseException:
            self.budget += reserved
            raise

    def _call_app(self, environ: dict[str, Any], body: bytes) -> _Answer:
        """Run the Flask app on a whole request (on a worker thread); its answer, a file left open."""
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            started[:] = [int(status.split(" ", 1)[0]), headers]
            return None

        result = self.app(environ, start_response)
        content: bytes | _FileAnswer = result if isinstance(result, _FileAnswer) else b""
        if not isinstance(result, _FileAnswer):
            try:
                content = b"".join(result)
            finally:
                getattr(result, "close", lambda: None)()
        status, headers = started
        return _Answer(
            status, [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers], content
        )


async def _read(incoming: _Incoming, rule: BodyRule) -> bytes:
    """The body, whole; _Refused as soon as it passes the rule's limit or its start fails the rule's check."""
    pieces: list[bytes] = []
    size, checked = 0, rule.check_start is None
    while not incoming.done:
        piece = await incoming.piece()
        size += len(piece)
        if size > rule.limit:
            reason = f"a body of more than {rule.limit} bytes; at most {rule.limit} are taken here"
            raise _Refused(_json_answer(413, reason), reason)
        pieces.append(piece)
        if not checked and (size >= rule.start_bytes or incoming.done):
            checked = True
            try:
                rule.check_start(b"".join(pieces)[: rule.start_bytes])  # type: ignore[misc] # not None here
            except ValueError as exc:
                raise _Refused(_json_answer(400, str(exc)), str(exc)) from None
    return b"".join(pieces)


async def _refuse(
    answer: _Answer, incoming: _Incoming, send: Send, drain_until: float | None, linger: bool = True
) -> None:
    """Send a refusal now; then read and drop the rest of the body until drain_until (None: not at all).

    A connection whose body is not read to its end is closed, LINGER_S after the refusal was sent where
    linger: closed on unread bytes, it is reset, and a client still sending may lose the refusal it has
    not read yet.
    """
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    await send({"type": "http.response.body", "body": answer.body, "more_body": True})
    body = b""
    if drain_until is not None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(drain_until):
                await _discard(incoming)
    if linger and not incoming.done:  # not read on meanwhile: the server reads no more than it has queued
        await asyncio.sleep(LINGER_S)
    # hypercorn closes the connection once the app has taken what it queued of the body: taken meanwhile
    leftover = asyncio.create_task(_discard(incoming))
    await send({"type": "http.response.body", "body": body, "more_body": False})
    await leftover


async def _discard(incoming: _Incoming) -> None:
    while not incoming.done:
        await incoming.piece()


async def _send(answer: _Answer, send: Send) -> None:
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    if isinstance(answer.body, _FileAnswer):  # read on the event loop: a local file, a piece at a time
        while piece := answer.body.file.read(_PIECE):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    else:
        await send({"type": "http.response.body", "body": answer.body, "more_body": False})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        kind = (await receive())["type"]
        if kind == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif kind == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body's declared length (0 without one); None for a chunked body. The parser checked both."""
    length = 0
    for name, value in headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            length = int(value)
    return length


def _environ(scope: Any) -> dict[str, Any]:
    """A WSGI environment for the request, its body still empty."""
    server, client = scope.get("server") or ("localhost", 80), scope.get("client")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": "",
        "PATH_INFO": urllib.parse.unquote_to_bytes(scope["raw_path"]).decode("latin-1"),
        "QUERY_STRING": scope["query_string"].decode("latin-1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": f"HTTP/{scope['http_version']}",
        "REMOTE_ADDR": client[0] if client else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope["scheme"],
        "wsgi.input": io.BytesIO(),
        "wsgi.input_terminated": True,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "wsgi.file_wrapper": _FileAnswer,
    }
    for raw_name, raw_value in scope["headers"]:
        if b"_" in raw_name:  # X_Token would pass for X-Token: dropped, as other servers do
            continue
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        key = name if name in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{name}"
        value = raw_value.decode("latin-1")
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


def _log_refusal(environ: dict[str, Any], refused: _Refused, level: int = logging.WARNING) -> None:
    if refused.reason:  # a route's refusals are logged by its own error handlers
        log.log(level, "%s %r from %s refused (%d): %s", environ["REQUEST_METHOD"], environ["PATH_INFO"],
                environ["REMOTE_ADDR"], refused.answer.status, refused.reason)  # fmt: skip
