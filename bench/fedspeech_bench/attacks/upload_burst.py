"""A token holder's burst of huge uploads, in a process of its own:
`python -m fedspeech_bench.attacks.upload_burst PORT TOKEN PATH NO_TASK_PATH`.

First 16 uploads of 64 MiB at once (the last 4 for a round the device has no task in), then 4 with a 36 MB
safetensors header at once (every other one chunked). Each is sent whole, as fast as the server takes it,
from one thread of a process that does nothing else, so that the time from the end of an upload's headers
to the first byte of its answer is the server's. Prints, as JSON, each burst's statuses and milliseconds.
"""

import argparse
import json
import selectors
import socket
import time
from dataclasses import dataclass
from typing import cast

MiB = 1024 * 1024
HUGE, HUGE_COUNT, NO_TASK_COUNT = 64 * MiB, 16, 4
HEADER, HEADER_COUNT = 36 * 1000 * 1000, 4
PIECE = 64 * 1024  # sent at a time: answers are looked for between pieces


@dataclass
class Upload:
    """One upload of a burst: its request, how much of it is sent, and what it got."""

    request: bytes
    sent: int = 0
    headers_sent_at: float = 0.0
    status: int = 0
    ms: float = 0.0  # from the end of its headers to the first byte of its answer


def request(path: str, token: str, body: bytes, chunked: bool) -> bytes:
    """A POST of body to path with the token, of declared length or chunked (1 MiB a chunk)."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = f"POST {path} HTTP/1.1\r\nHost: coordinator\r\nAuthorization: Bearer {token}\r\n{framing}\r\n\r\n"
    if chunked:
        pieces = (body[i : i + MiB] for i in range(0, len(body), MiB))
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    return head.encode() + body


def long_header_blob() -> bytes:
    """A safetensors blob whose JSON header is 36 MB long: metadata no parser should be asked to read."""
    header = b'{"__metadata__":{"padding":"' + b"x" * (HEADER - 32) + b'"}}'
    return len(header).to_bytes(8, "little") + header


def burst(port: int, uploads: list[Upload]) -> None:
    """Send every upload at once and whole; time each answer from the end of its headers."""
    with selectors.DefaultSelector() as selector:
        for upload in uploads:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, upload)
        deadline = time.monotonic() + 60
        while selector.get_map() and time.monotonic() < deadline:
            for key, events in selector.select(timeout=1.0):
                sock, upload = cast(socket.socket, key.fileobj), key.data
                try:
                    if events & selectors.EVENT_READ:  # the answer: timed, and the body sent on regardless
                        reply = sock.recv(12)
                        upload.ms = (time.monotonic() - upload.headers_sent_at) * 1000
                        upload.status = int(reply[9:12]) if reply.startswith(b"HTTP/1.1 ") else -1
                        selector.modify(sock, selectors.EVENT_WRITE, upload)
                    if events & selectors.EVENT_WRITE:
                        upload.sent += sock.send(
                            memoryview(upload.request)[upload.sent : upload.sent + PIECE]
                        )
                        if (
                            not upload.headers_sent_at
                            and upload.sent >= upload.request.index(b"\r\n\r\n") + 4
                        ):
                            upload.headers_sent_at = time.monotonic()
                        if upload.sent == len(upload.request):
                            raise ConnectionError("all sent")
                except OSError:  # all sent, or the server closed the connection: the rest is not read
                    selector.unregister(sock)
                    sock.close()


def main() -> None:
    """Send the two bursts and print what each upload got."""
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("token")
    parser.add_argument("path", help="the upload path of the device's open task")
    parser.add_argument("no_task_path", help="the upload path of a round it has no task in")
    args = parser.parse_args()
    huge, long_header = b"\0" * HUGE, long_header_blob()
    made = {  # each distinct request made once, before any is sent
        "huge": request(args.path, args.token, huge, False),
        "no task": request(args.no_task_path, args.token, huge, False),
        "long header": request(args.path, args.token, long_header, False),
        "long header, chunked": request(args.path, args.token, long_header, True),
    }
    kinds = [
        ["huge"] * (HUGE_COUNT - NO_TASK_COUNT) + ["no task"] * NO_TASK_COUNT,
        ["long header", "long header, chunked"] * (HEADER_COUNT // 2),
    ]
    bursts = [[Upload(made[kind]) for kind in burst_kinds] for burst_kinds in kinds]
    for uploads in bursts:
        burst(args.port, uploads)
    print(json.dumps([[{"status": u.status, "ms": u.ms} for u in uploads] for uploads in bursts]), flush=True)


if __name__ == "__main__":
    main()
