"""The HTTP server's listening socket: caps on the connections one address, and all of them, hold open.

asyncio's event loop accepts connections by calling the listening socket's accept(); this socket's accept
closes a connection whose address already holds its cap, or that would pass the cap on all connections,
before any TLS handshake or byte of HTTP is read, so that no client, nor many at once, can take the file
descriptors the rest of the coordinator needs (SQLite, model files, the broker link): the cap on all of
them stays FD_RESERVE below the process's limit of open files.
Each accepted connection also remembers when it became ready for a request (accepted, or its last answer
sent), the moment a request's deadline counts from.
"""

import logging
import math
import resource
import socket
import time
from collections import Counter

log = logging.getLogger(__name__)

WARN_EVERY_S = 60.0  # an address at its cap, or the server at its own, is logged once a minute at most
FD_RESERVE = 256  # open files kept for the rest of the coordinator: SQLite, model files, MQTT, logs
Address = tuple[str, int]  # a peer's host and port, as the server's requests name their client


def _address(addr: tuple) -> Address:
    return addr[0], addr[1]  # an IPv6 address has flow and scope ids too


def connection_cap(wanted: int) -> int:
    """The most HTTP connections to hold open at once: wanted, within the open-files limit less FD_RESERVE.

    The process's soft limit is raised first, as far as its hard limit allows, to make room for wanted
    (a systemd service starts with a soft limit of 1024).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if raised > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    return wanted if soft == resource.RLIM_INFINITY else max(1, min(wanted, soft - FD_RESERVE))


class Listener(socket.socket):
    """A listening TCP socket that accepts at most per_client open connections from one host, and at most
    total from all of them.
    """

    def __init__(self, host: str, port: int, per_client: int, total: int) -> None:
        """Bound to host:port (port 0: any free one) and listening; OSError if it cannot be."""
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        super().__init__(family, socket.SOCK_STREAM)
        self.per_client, self.total = per_client, total
        self.open: Counter[str] = Counter()  # host -> its connections open now
        self.open_total = 0
        self._ready: dict[Address, float] = {}  # connection -> time.monotonic() it became ready
        self._warned: dict[str, float] = {}  # host -> when it was last said to be at its cap
        try:
            self.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.bind(sockaddr)
            self.listen(256)
        except OSError:
            self.close()
            raise

    def accept(self) -> tuple[socket.socket, tuple]:
        """The next waiting connection under its host's cap and the total's; others are closed on the way."""
        while True:
            fd, addr = self._accept()  # type: ignore[attr-defined] # socket.socket's own, undocumented
            host = addr[0]
            if self.open[host] < self.per_client and self.open_total < self.total:
                break
            socket.close(fd)
            full = self.open_total >= self.total
            if full and self._warn(""):
                log.warning(
                    "%d HTTP connections open from %d addresses, the most at once: more are closed at "
                    "once", self.open_total, len(self.open),
                )  # fmt: skip
            elif not full and self._warn(host):
                log.warning("%r holds %d HTTP connections: more are closed at once", host, self.per_client)
        self.open[host] += 1
        self.open_total += 1
        self._ready[_address(addr)] = time.monotonic()
        return _Connection(self, _address(addr), self.family, self.type, self.proto, fd), addr

    def _warn(self, host: str) -> bool:
        """Whether to log that host ('': the server) is at its cap: once every WARN_EVERY_S at most."""
        now = time.monotonic()
        if now - self._warned.get(host, -math.inf) <= WARN_EVERY_S:
            return False
        self._warned[host] = now
        return True

    def ready_since(self, client: Address | None, default: float) -> float:
        """When a connection became ready for its next request (time.monotonic()); default if unknown."""
        return self._ready.get(client, default) if client is not None else default

    def ready(self, client: Address | None) -> None:
        """A connection answered its request: the next one's deadline counts from now."""
        if client in self._ready:
            self._ready[client] = time.monotonic()

    def _release(self, client: Address) -> None:
        self._ready.pop(client, None)
        host = client[0]
        self.open[host] -= 1
        self.open_total -= 1
        if self.open[host] <= 0:
            del self.open[host]
            self._warned.pop(host, None)


class _Connection(socket.socket):
    """An accepted connection that gives its place back to its listener when it is closed."""

    def __init__(
        self, listener: Listener, client: Address, family: int, kind: int, proto: int, fd: int
    ) -> None:
        super().__init__(family, kind, proto, fileno=fd)
        self._listener: Listener | None = listener
        self._client = client

    def close(self) -> None:
        """Close the connection, once, and free its place."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener._release(self._client)
        super().close()
