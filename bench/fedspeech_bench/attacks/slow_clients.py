"""Slow clients, run as a process of their own: `python -m fedspeech_bench.attacks.slow_clients HOST PORT`.

Each of COUNT connections sends the start of a request and then one byte every PERIOD seconds, half of
them in the headers and half in a registration's body, as a client on a bad link or an attacker would;
a connection the server closes is opened again at once. After SECONDS it prints, as JSON, how many
connections it opened, how many the server closed before any answer within a moment of their opening
(refused), the longest any connection stayed open, and the longest a connection took to be made.
Run them on another host, or give them another source address (`--source 127.0.0.2`): a server that caps
connections per address must not see them as the honest clients.
"""

import argparse
import json
import socket
import threading
import time

REFUSED_WITHIN_S = 0.5


def _start(host: str, in_body: bool) -> bytes:
    if in_body:
        return f"POST /api/devices HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1000\r\n\r\n{{".encode()
    return f"GET /api/status HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode()


def main() -> None:
    """Run the slow clients and print what they saw."""
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--source", help="connect from this address (default: the system's choice)")
    args = parser.parse_args()
    until = time.monotonic() + args.seconds
    source = (args.source, 0) if args.source else None
    lock = threading.Lock()
    seen = {"opened": 0, "refused": 0, "longest_open_s": 0.0, "longest_connect_s": 0.0}

    def client(n: int) -> None:
        while time.monotonic() < until:
            opened = time.monotonic()
            try:
                with socket.create_connection((args.host, args.port), 5, source) as sock:
                    connected = time.monotonic()
                    with lock:
                        seen["longest_connect_s"] = max(seen["longest_connect_s"], connected - opened)
                    opened = connected  # the server's clock for it starts about now
                    sock.sendall(_start(args.host, in_body=n % 2 == 1))
                    with lock:
                        seen["opened"] += 1
                    sock.settimeout(args.period)
                    while time.monotonic() < until:
                        try:
                            if not sock.recv(4096):
                                break  # closed by the server
                        except TimeoutError:
                            sock.send(b"a")
            except OSError:
                pass
            open_for = time.monotonic() - opened
            with lock:
                seen["longest_open_s"] = max(seen["longest_open_s"], open_for)
                seen["refused"] += int(open_for < REFUSED_WITHIN_S)
            if open_for < REFUSED_WITHIN_S:
                time.sleep(0.2)  # and again, without flooding the link

    threads = [threading.Thread(target=client, args=(n,)) for n in range(args.count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
