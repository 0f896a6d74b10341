"""The coordinator's HTTP server under hostile clients: huge chunked bodies, bad tokens, silent sockets."""

import datetime
import ipaddress
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedspeech.coordinator.app import create_app, serve
from fedspeech.coordinator.http.api import MAX_UPDATE_BYTES
from fedspeech.protocol import messages, weights
from fedspeech.protocol.messages import Credentials, Profile, Registration
from tests.helpers.configs import coordinator_config
from tests.helpers.devices import one_round_coordinator, upload
from tests.helpers.ports import free_port
from tests.helpers.waiting import get_json, wait_for

HTTP_TIMEOUT_S = 2.0
MiB = 1024 * 1024


@dataclass
class Reply:
    """What a raw client saw: the bytes it got across before the server stopped it, and the reply."""

    sent: int
    reply: bytes


def _post_chunked(port: int, path: str, token: str, total: int, piece: int = MiB) -> Reply:
    """POST total bytes in chunks of piece, stopping when the server stops reading; then read its reply.

    The body starts as a safetensors blob with a 4 KiB header would.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: coordinator\r\nAuthorization: Bearer {token}\r\n"
        sock.sendall(head.encode() + b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n" % piece + (4096).to_bytes(8, "little") + b"\xab" * (piece - 8) + b"\r\n"
        sent = 0
        try:
            while sent < total:
                sock.sendall(chunk)
                sent += piece
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server closed the connection: it reads no more
        try:
            reply = sock.recv(4096)
        except OSError:
            reply = b""
    return Reply(sent, reply)


def _announce_huge_chunk(port: int, path: str, token: str) -> bytes:
    """Announce a chunk of 500 MiB and send none of it; return the server's reply, at its deadline."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: coordinator\r\nAuthorization: Bearer {token}\r\n"
        sock.sendall(head.encode() + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % (500 * MiB))
        return sock.recv(4096)


def _register(url: str, device_id: str) -> str:
    body = messages.encode(Registration(device_id, 40, Profile(1, 0.0, 256.0)))
    request = urllib.request.Request(f"{url}/api/devices", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return messages.decode(reply.read(), Credentials).token


@dataclass
class CoordinatorProcess:
    """A coordinator in a process of its own: its URL, port and process."""

    url: str
    port: int
    process: psutil.Process


@pytest.fixture
def coordinator_process(tmp_path, mosquitto_url, topic_root, processes) -> Iterator[CoordinatorProcess]:
    port = free_port()
    proc = processes.start(
        "coordinator",
        "coordinator",
        "--state", str(tmp_path / "state"), "--new-state",
        "--broker", mosquitto_url,
        "--port", str(port),
        "--topic-root", topic_root,
        "--open-enrolment",
        "--http-timeout", str(HTTP_TIMEOUT_S),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: get_json(f"{url}/api/status") or proc.poll() is not None, 90, "the coordinator to serve")
    assert proc.poll() is None, proc.log_path.read_text()[-2000:]
    yield CoordinatorProcess(url, port, psutil.Process(proc.pid))


def test_a_huge_chunked_body_with_a_bad_token_is_not_read(coordinator_process):
    coordinator = coordinator_process
    _register(coordinator.url, "kitchen")  # the coordinator has a device, and its token table is in use
    before = coordinator.process.memory_info().rss
    peak = before
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.wait(0.05):
            peak = max(peak, coordinator.process.memory_info().rss)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = _post_chunked(
            coordinator.port, "/api/rounds/1/updates", "forged-token-" + "x" * 30, 500 * MiB
        )
    finally:
        done.set()
        watcher.join()
    growth = (peak - before) / MiB
    print(f"coordinator RSS grew {growth:.1f} MiB; the client got {result.sent / MiB:.0f} MiB across")
    assert result.reply.startswith(b"HTTP/1.1 401"), result.reply[:200]
    assert growth < 100
    assert result.sent < 100 * MiB, "the server closed the connection instead of reading the body"
    assert get_json(f"{coordinator.url}/api/status") is not None, "and it still serves"


@pytest.mark.parametrize("sent", [b"", b"POST /api/devices HTTP/1.1\r\nHost: coordinator\r\nContent-Le"])
def test_a_silent_connection_is_closed_within_the_timeout(coordinator_process, sent):
    with socket.create_connection(("127.0.0.1", coordinator_process.port), timeout=60) as sock:
        sock.sendall(sent)
        opened = time.monotonic()
        received = b""
        while chunk := sock.recv(4096):  # until the server closes the connection
            received += chunk
        open_for = time.monotonic() - opened
    what = "half-sent request" if sent else "idle connection"
    print(f"{what} closed after {open_for:.2f} s: {received[:40]!r}")
    assert open_for < HTTP_TIMEOUT_S + 3.0
    assert received == b"" or received.startswith(b"HTTP/1.1 408")


def test_a_damaged_state_database_stops_the_coordinator_with_one_line(tmp_path, mosquitto_url, topic_root):
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.sqlite3").write_bytes(b"these bytes are not an SQLite database\n" * 100)
    args = ["--state", str(state), "--broker", mosquitto_url, "--topic-root", topic_root, "--port", "0"]
    result = subprocess.run(
        [sys.executable, "-m", "fedspeech", "coordinator", *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert str(state / "state.sqlite3") in last and "restore it" in last, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert (state / "state.sqlite3").read_bytes().startswith(b"these bytes"), "never reset"


@pytest.fixture
def served_round(tmp_path, mosquitto_url, topic_root):
    """A one-round coordinator in this process behind the real HTTP server; yields (service, url, device)."""
    config = {"eval_every": 0, "round_timeout": 120.0, "http_timeout": HTTP_TIMEOUT_S}
    with one_round_coordinator(tmp_path, mosquitto_url, topic_root, "kitchen", **config) as (
        app,
        service,
        device,
    ):
        server = serve(app, "127.0.0.1", 0)
        try:
            yield service, server, device
        finally:
            server.stop()


def test_bodies_over_the_limit_and_absurd_counts_never_reach_the_round(served_round):
    service, server, device = served_round
    wait_for(lambda: service.store.latest_round(), 120, "round 0")
    device.register(server.url, 40)
    device.go_online(40)
    task = device.next_task(60)
    with urllib.request.urlopen(f"{server.url}{task.weights.path}", timeout=10) as reply:
        arrays, _ = weights.decode(reply.read())

    over = _post_chunked(server.port, task.upload_path, device.token, MAX_UPDATE_BYTES + 4 * MiB)
    assert over.reply.startswith(b"HTTP/1.1 413"), over.reply[:200]
    announced = time.monotonic()
    huge = _announce_huge_chunk(server.port, task.upload_path, device.token)
    assert huge.startswith(b"HTTP/1.1 408"), huge[:200]  # nothing is set aside for what a chunk announces
    assert time.monotonic() - announced < HTTP_TIMEOUT_S + 1.0
    # a device whose token is stale sends its whole body first, then reads: it must get the 401
    stale = weights.encode(arrays, {"task_id": task.task_id, "num_samples": "40"}) + b"\0" * (8 * MiB)
    assert upload(server.url, task.upload_path, "a-stale-token-of-kitchen", stale) == 401
    absurd = weights.encode(arrays, {"task_id": task.task_id, "num_samples": str(10**400)})
    assert upload(server.url, task.upload_path, device.token, absurd) == 400
    assert service.uploads.open_round() == 1, "the round goes on"

    good = weights.encode(arrays, {"task_id": task.task_id, "num_samples": "40"})
    assert upload(server.url, task.upload_path, device.token, good) == 200
    wait_for(service.orchestrator.finished.is_set, 60, "the round to complete")
    record = service.store.latest_round()
    assert record.round == 1 and record.results == 1
    assert record.bytes_up == len(good), "refused bodies are not counted as traffic"


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "coordinator")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "coordinator.crt", folder / "coordinator.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


def test_https_with_the_operators_certificate(tmp_path, mosquitto_url, topic_root):
    cert, key = _self_signed(tmp_path)
    config = coordinator_config(tmp_path, broker=mosquitto_url, topic_root=topic_root)
    server = serve(create_app(config.changed(tls_cert=cert, tls_key=key)), "127.0.0.1", 0)
    try:
        assert server.url.startswith("https://")
        trusting = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(f"{server.url}/api/key", timeout=10, context=trusting) as reply:
            assert "coordinator_key" in reply.read().decode()
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(f"{server.url}/api/key", timeout=10)  # the system's CAs do not know it
    finally:
        server.stop()
