"""The HTTP server against slow and hostile clients: a small Flask app behind the coordinator's server.

Each defence is shown by the attack it stops: clients that send a byte now and then, a Content-Length of -1
or of 10^20, more connections than an address may hold, bodies refused by their route before they are
read, safetensors headers too long to parse, more bodies at once than the budget, a reader that never reads.
"""

import logging
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from flask import Flask, jsonify, request, send_file
from werkzeug.exceptions import Conflict

from fedspeech.coordinator.config import APP_KEY, CoordinatorConfig
from fedspeech.coordinator.http import request_reading
from fedspeech.coordinator.http.body_rules import BodyRule
from fedspeech.coordinator.http.server import HttpServer, serve
from fedspeech.protocol import weights

MiB = 1024 * 1024
UPLOAD_LIMIT = 64 * MiB


def _no_task() -> BodyRule:
    raise Conflict("no open task")


RULES = {
    "upload": lambda: BodyRule(UPLOAD_LIMIT, weights.check_header_length, weights.HEADER_LENGTH_BYTES),
    "small": lambda: BodyRule(MiB),
    "closed": _no_task,
}


def _app(big_file: Path) -> Flask:
    app = Flask(__name__)

    @app.get("/status")
    def status():
        return jsonify(ok=True)

    @app.post("/upload")
    def upload():
        return jsonify(size=len(request.get_data()))

    @app.post("/small")
    def small():
        return jsonify(size=len(request.get_data()))

    @app.post("/closed")
    def closed():
        raise AssertionError("the rule refuses every request here")

    @app.get("/file")
    def file():
        return send_file(big_file)

    return app


@contextmanager
def _served(tmp_path: Path, **service) -> Iterator[HttpServer]:
    big_file = tmp_path / "model.bin"
    big_file.write_bytes(b"\x01" * 32 * MiB)
    app = _app(big_file)
    app.config[APP_KEY] = CoordinatorConfig().changed(state=tmp_path, **service)
    server = serve(app, "127.0.0.1", 0, RULES)
    try:
        yield server
    finally:
        server.stop()


def _connect(server: HttpServer, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(data)
    return sock


def _head(path: str, *headers: str, method: str = "POST") -> bytes:
    return "".join(f"{line}\r\n" for line in (f"{method} {path} HTTP/1.1", "Host: x", *headers, "")).encode()


def _reply(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (or 10 s pass)."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except OSError:
        pass
    return received


def _status_within(sock: socket.socket, seconds: float) -> int:
    """The status of the reply, which must start within seconds."""
    sock.settimeout(seconds)
    line = sock.recv(12)
    assert line.startswith(b"HTTP/1.1 "), line
    return int(line[9:12])


def _get_status(server: HttpServer) -> float:
    """Seconds an honest GET took."""
    started = time.monotonic()
    with urllib.request.urlopen(f"{server.url}/status", timeout=10) as reply:
        assert reply.status == 200
    return time.monotonic() - started


@contextmanager
def _drippers(server: HttpServer, count: int, period: float) -> Iterator[None]:
    """count connections that each send a byte of their request every period seconds, half of them in
    the headers and half in a body, reconnecting when the server closes them."""
    stop = threading.Event()

    def drip(n: int) -> None:
        start = _head("/small", f"Content-Length: {MiB}") if n % 2 else b"GET /status HTTP/1.1\r\nX-Slow: "
        while not stop.is_set():
            try:
                with _connect(server, start) as sock:
                    while not stop.wait(period):
                        sock.send(b"a")
            except OSError:
                pass  # closed by the server: connect again

    threads = [threading.Thread(target=drip, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=period + 5)


@pytest.mark.parametrize(
    ("length", "status"), [("-1", 400), ("12abc", 400), (str(10**18), 413), (str(10**30), 400)]
)
def test_a_negative_or_absurd_content_length_is_refused_at_once(tmp_path, length, status):
    with _served(tmp_path) as server, _connect(server, _head("/upload", f"Content-Length: {length}")) as sock:
        started = time.monotonic()
        assert _status_within(sock, 1.0) == status
        answered = time.monotonic() - started
        _reply(sock)  # and the connection is closed, with no body read, once the client had time to read
        closed = time.monotonic() - started
    print(f"Content-Length: {length}: {status} in {answered * 1000:.1f} ms, closed in {closed * 1000:.1f} ms")
    assert closed < request_reading.LINGER_S + 1.0


def test_a_request_must_arrive_whole_by_its_deadline(tmp_path):
    """A byte every 0.2 s never trips a timeout per read; the deadline closes both clients all the same."""
    with _served(tmp_path, http_timeout=1.5) as server:
        in_headers = _connect(server, b"POST /small HTTP/1.1\r\n")
        in_body = _connect(server, _head("/small", f"Content-Length: {MiB}"))
        opened, closed = time.monotonic(), {}
        while len(closed) < 2 and time.monotonic() - opened < 6:
            for name, sock in (("headers", in_headers), ("body", in_body)):
                if name in closed:
                    continue
                try:
                    sock.send(b"X")
                except OSError:
                    closed[name] = time.monotonic() - opened
            time.sleep(0.2)
        reply = _reply(in_body)
        in_headers.close()
        in_body.close()
    print(f"closed after {closed}")
    assert closed.keys() == {"headers", "body"}, "a slow client outlived its deadline"
    assert max(closed.values()) < 1.5 + 1.0
    assert reply.startswith(b"HTTP/1.1 408"), reply[:100]


def test_slow_clients_hold_no_worker(tmp_path):
    """Two workers, 24 clients sending a byte every 0.5 s: an honest GET and upload are answered at once."""
    with _served(tmp_path, http_threads=2) as server, _drippers(server, 24, 0.5):
        time.sleep(1.0)
        slowest = max(_get_status(server) for _ in range(10))
        body = b"\x08" + b"\0" * 7 + b"{}" * 1000
        request = urllib.request.Request(f"{server.url}/upload", body, method="POST")
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200
        upload_took = time.monotonic() - started
    print(f"slowest GET {slowest:.3f} s, upload {upload_took:.3f} s")
    assert slowest < 1.0 and upload_took < 1.0


def test_an_address_holds_no_more_connections_than_its_cap(tmp_path):
    with _served(tmp_path, http_connections_per_client=4) as server, ExitStack() as held:
        for _ in range(4):
            held.enter_context(_connect(server, b"GET /sta"))
        time.sleep(0.2)
        with _connect(server, _head("/status", method="GET")) as fifth:
            assert _reply(fifth) == b"", "a fifth connection is closed unanswered"
        held.close()  # their places are given back
        time.sleep(0.2)
        assert _get_status(server) < 1.0


def test_all_addresses_together_hold_no_more_connections_than_the_cap(tmp_path, caplog):
    """Many addresses each under their own cap still cannot take the descriptors the coordinator needs."""

    def from_address(n: int, data: bytes = b"GET /sta") -> socket.socket:
        sock = socket.socket()
        sock.settimeout(10)
        sock.bind((f"127.0.0.{n}", 0))  # every 127.x.y.z is this machine: an address of its own each
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(data)
        return sock

    caplog.set_level(logging.WARNING, logger="fedspeech.coordinator.http.listening_socket")
    with (
        _served(tmp_path, http_connections=4, http_connections_per_client=100) as server,
        ExitStack() as held,
    ):
        first = [held.enter_context(from_address(n)) for n in range(2, 6)]
        time.sleep(0.2)
        for n in range(6, 16):  # ten more addresses, each with its first connection
            with from_address(n, _head("/status", method="GET")) as over:
                assert _reply(over) == b"", f"127.0.0.{n}: a connection past the total is closed unanswered"
        warnings = [r.getMessage() for r in caplog.records]
        assert warnings == [
            "4 HTTP connections open from 4 addresses, the most at once: more are closed at once"
        ]
        first[0].close()  # a place is given back
        time.sleep(0.2)
        assert _get_status(server) < 1.0


def test_the_cap_on_all_connections_leaves_the_coordinator_its_open_files():
    """Raised within the hard limit of open files; where that is too low, FD_RESERVE below it."""
    code = (
        "import resource; from fedspeech.coordinator.http.listening_socket import connection_cap; "
        "cap = connection_cap(4096); print(cap, resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # what this process may raise its own to
    if hard < 8192:
        pytest.skip(f"this machine's hard limit of open files, {hard}, leaves no room to raise one")
    cases = (("1024:1024", "768 1024"), (f"1024:{hard}", "4096 4352"), (f"8192:{hard}", "4096 8192"))
    for limits, expected in cases:
        run = subprocess.run(
            ["prlimit", f"--nofile={limits}", sys.executable, "-c", code], capture_output=True, text=True
        )
        assert run.stdout.split() == expected.split(), (limits, run.stdout, run.stderr)


def test_a_body_its_route_refuses_is_not_read(tmp_path):
    with _served(tmp_path) as server:
        # declared and unsent: the refusal comes at once, before a byte of it
        with _connect(server, _head("/closed", f"Content-Length: {60 * MiB}")) as sock:
            assert _status_within(sock, 0.5) == 409
        # a client that sends all of its body before it reads still gets the refusal
        request = urllib.request.Request(f"{server.url}/closed", b"\0" * 8 * MiB, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 409
        # chunked: refused and closed, the rest unread
        with _connect(server, _head("/closed", "Transfer-Encoding: chunked")) as sock:
            assert _status_within(sock, 0.5) == 409
            _reply(sock)
        # larger than the route takes: refused at once
        with _connect(server, _head("/small", f"Content-Length: {2 * MiB}")) as sock:
            assert _status_within(sock, 0.5) == 413


@pytest.mark.parametrize("linger_s", [request_reading.LINGER_S, 0.0])
def test_a_client_still_sending_a_refused_body_reads_its_refusal(tmp_path, monkeypatch, linger_s):
    # A client that sends before it reads (most do; a loaded machine widens the gap) finds a connection
    # closed at once after the refusal reset under its next send, and may give up unread: the refusal lost
    monkeypatch.setattr(request_reading, "LINGER_S", linger_s)
    chunked = _head("/closed", "Transfer-Encoding: chunked")
    with _served(tmp_path) as server, _connect(server, chunked) as sock:
        sock.settimeout(0.01)
        chunk = b"%x\r\n%s\r\n" % (64 * 1024, b"\0" * 64 * 1024)
        reset, until = False, time.monotonic() + 0.3
        while time.monotonic() < until and not reset:
            try:
                sock.send(chunk)
            except (TimeoutError, BlockingIOError):
                pass  # the server reads no more of a refused body: its buffers are full
            except ConnectionError:
                reset = True
        sock.settimeout(5)
        answer = sock.recv(12)
    assert answer == b"HTTP/1.1 409", answer
    assert reset is (linger_s == 0.0), "kept open LINGER_S after the refusal, the client's sends go on"


def test_a_safetensors_header_too_long_to_parse_is_refused_from_the_first_bytes(tmp_path):
    header_length = (36 * 1000 * 1000).to_bytes(8, "little")
    with (
        _served(tmp_path) as server,
        _connect(server, _head("/upload", "Transfer-Encoding: chunked") + b"8\r\n" + header_length) as sock,
    ):
        sock.sendall(b"\r\n")
        assert _status_within(sock, 0.5) == 400
        assert b"safetensors header of 36000000 bytes" in _reply(sock)


def test_the_bodies_held_at_once_are_bounded_by_the_budget(tmp_path):
    with _served(tmp_path, http_body_budget=64 * MiB) as server:
        first = _connect(server, _head("/upload", f"Content-Length: {40 * MiB}") + b"\x08")
        time.sleep(0.3)
        with _connect(server, _head("/upload", f"Content-Length: {40 * MiB}")) as second:
            assert _status_within(second, 0.5) == 503
        first.close()  # its share of the budget is given back
        time.sleep(0.3)
        body = b"\x08" + b"\0" * (40 * MiB - 1)
        request = urllib.request.Request(f"{server.url}/upload", body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200


def test_a_client_that_does_not_read_its_answer_holds_no_worker(tmp_path):
    with _served(tmp_path, http_threads=1) as server, ExitStack() as held:
        for _ in range(3):  # each asks for a 32 MiB file and reads none of it
            held.enter_context(_connect(server, _head("/file", method="GET")))
        time.sleep(0.5)
        assert _get_status(server) < 1.0
