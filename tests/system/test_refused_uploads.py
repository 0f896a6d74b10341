"""A token holder's burst of huge uploads against a real coordinator: refused before it is read.

The issue's attack: 16 uploads of 64 MiB raised the coordinator to 2.1 GB (1.1 GB still resident after),
and 4 uploads with 36 MB safetensors headers cost 24 s of CPU. Here a device that holds a token and an
open task sends them all at once, and 4 more of 64 MiB for a round it has no task in; each is refused
within 50 ms of its headers (no task; a declared size over what its task takes; first 8 bytes that
announce a header too long to parse), the coordinator's RSS stays within 200 MB of where it was and is
back within 10 s, and the device's honest upload is then taken.
"""

import selectors
import socket
import threading
import time
from dataclasses import dataclass

import psutil
import pytest

from fedspeech.protocol import routes
from fedspeech.protocol.topics import Topics
from tests.helpers.devices import ScriptedDevice, unchanged_update, upload
from tests.helpers.ports import free_port
from tests.helpers.waiting import get_json, wait_for

MiB = 1024 * 1024
HUGE, HUGE_COUNT, NO_TASK_COUNT = 64 * MiB, 16, 4
HEADER, HEADER_COUNT = 36 * 1000 * 1000, 4
REFUSED_WITHIN_S, RSS_GROWTH_MB, BACK_WITHIN_S = 0.050, 200, 10.0
PIECE = 64 * 1024  # sent at a time: the client looks for answers between pieces


@dataclass
class Upload:
    """One upload of the burst, sent by _burst: its request, what is sent of it, and what it got."""

    request: bytes
    sent: int = 0
    headers_sent_at: float = 0.0
    status: int = 0
    seconds: float = 0.0  # from its headers to the first byte of its answer


def _request(path: str, token: str, body: bytes, chunked: bool) -> bytes:
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = f"POST {path} HTTP/1.1\r\nHost: coordinator\r\nAuthorization: Bearer {token}\r\n{framing}\r\n\r\n"
    if chunked:
        body = b"".join(
            b"%x\r\n%s\r\n" % (len(p), p) for p in (body[i : i + MiB] for i in range(0, len(body), MiB))
        )
        body += b"0\r\n\r\n"
    return head.encode() + body


def _burst(port: int, uploads: list[Upload]) -> None:
    """Send every upload at once, each whole and as fast as the server takes it, from one thread (so that no
    thread of the test waits for another to notice its answer); time each answer from the end of its headers.
    """
    with selectors.DefaultSelector() as selector:
        for upload_ in uploads:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, upload_)
        deadline = time.monotonic() + 60
        while selector.get_map() and time.monotonic() < deadline:
            for key, events in selector.select(timeout=1.0):
                sock, upload_ = key.fileobj, key.data
                assert isinstance(sock, socket.socket)
                try:
                    if events & selectors.EVENT_READ:  # the answer: timed, and the body sent on regardless
                        reply = sock.recv(12)
                        upload_.seconds = time.monotonic() - upload_.headers_sent_at
                        upload_.status = int(reply[9:12]) if reply.startswith(b"HTTP/1.1 ") else -1
                        selector.modify(sock, selectors.EVENT_WRITE, upload_)
                    if events & selectors.EVENT_WRITE:
                        upload_.sent += sock.send(
                            memoryview(upload_.request)[upload_.sent : upload_.sent + MiB]
                        )
                        if (
                            not upload_.headers_sent_at
                            and upload_.sent >= upload_.request.index(b"\r\n\r\n") + 4
                        ):
                            upload_.headers_sent_at = time.monotonic()
                        if upload_.sent == len(upload_.request):
                            raise ConnectionError("all sent")
                except OSError:  # all sent, or the server closed the connection: the rest is not read
                    selector.unregister(sock)
                    sock.close()


def _long_header_blob(tensors: bytes) -> bytes:
    """A safetensors blob whose JSON header is 36 MB long: metadata no parser should be asked to read."""
    header = b'{"__metadata__":{"padding":"' + b"x" * (HEADER - 32) + b'"}}'
    return len(header).to_bytes(8, "little") + header + tensors


@pytest.mark.alone  # times each refusal against 50 ms and samples the coordinator's memory
@pytest.mark.timeout(300)
def test_a_token_holders_burst_of_huge_uploads_is_refused_before_it_is_read(
    tmp_path, mosquitto_url, topic_root, processes
):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = processes.start(
        "coordinator", "coordinator", "--state", str(tmp_path / "state"), "--port", str(port),
        "--broker", mosquitto_url, "--topic-root", topic_root, "--open-enrolment", "--rounds", "1",
        "--min-devices", "1", "--min-results", "1", "--round-timeout", "300", "--eval-every", "0",
    )  # fmt: skip
    wait_for(lambda: get_json(f"{url}/api/status") or proc.poll() is not None, 90, "the coordinator to serve")
    assert proc.poll() is None, proc.log_path.read_text()[-2000:]
    device = ScriptedDevice("mallory", mosquitto_url, Topics(topic_root))
    try:
        device.register(url, 40)
        device.go_online(40)
        task = device.next_task(180)
        honest = unchanged_update(url, task, 40)
        coordinator = psutil.Process(proc.pid)
        time.sleep(2.0)  # the download's buffers settle
        before = coordinator.memory_info().rss
        peak, sampling = before, threading.Event()

        def sample() -> None:
            nonlocal peak
            while not sampling.wait(0.01):
                peak = max(peak, coordinator.memory_info().rss)

        sampler = threading.Thread(target=sample)
        sampler.start()
        huge = b"\x00" * HUGE
        long_header = _long_header_blob(honest[8 + int.from_bytes(honest[:8], "little") :])
        path, no_task = task.upload_path, routes.updates(task.round + 1)  # a round it has no task in
        uploads = [(path, huge, False)] * HUGE_COUNT + [(no_task, huge, False)] * NO_TASK_COUNT
        uploads += [(path, long_header, False), (path, long_header, True)] * HEADER_COUNT
        refusals = [Upload(_request(path, device.token, body, chunked)) for path, body, chunked in uploads]
        started = time.monotonic()
        _burst(port, refusals)
        burst_s = time.monotonic() - started
        settled = None
        while time.monotonic() - started - burst_s < BACK_WITHIN_S:
            if coordinator.memory_info().rss - before < 32 * MiB:
                settled = time.monotonic() - started - burst_s
                break
            time.sleep(0.1)
        sampling.set()
        sampler.join()
        after = coordinator.memory_info().rss
        status = upload(url, task.upload_path, device.token, honest)
    finally:
        device.close()
    times = sorted(r.seconds * 1000 for r in refusals)
    print(
        f"{len(refusals)} refused: statuses {sorted({r.status for r in refusals})}, in {times[0]:.1f} to "
        f"{times[-1]:.1f} ms (median {times[len(times) // 2]:.1f}); burst sent in {burst_s:.2f} s; "
        f"coordinator RSS {before / MiB:.0f} MiB before, peak +{(peak - before) / MiB:.1f} MiB, "
        f"+{(after - before) / MiB:.1f} MiB after ({settled} s to within 32 MiB)"
    )
    # over what its task takes, no task, too large again, a header too long to parse
    assert [r.status for r in refusals] == [413] * HUGE_COUNT + [409] * NO_TASK_COUNT + [
        413,
        400,
    ] * HEADER_COUNT
    assert max(r.seconds for r in refusals) < REFUSED_WITHIN_S
    assert peak - before < RSS_GROWTH_MB * 1000 * 1000
    assert settled is not None, f"RSS not back within {BACK_WITHIN_S} s"
    assert status == 200, "and the device's honest upload is taken"
