"""The HTTP server's listening socket: a cap on the connections one address may hold open.

asyncio's event loop accepts connections by calling the listening socket's accept(); this socket's accept
closes a connection whose address already holds its cap, before any TLS handshake or byte of HTTP is
read, so that one client cannot take the server's file descriptors however many connections it opens.
Each accepted connection also remembers when it became ready for a request (accepted, or its last answer
sent), the moment a request's deadline counts from.
"""

import logging
import math
import socket
import time
from collections import Counter

log = logging.getLogger(__name__)

WARN_EVERY_S = 60.0  # an address at its cap is logged once a minute at most
Address = tuple[str, int]  # a peer's host and port, as the server's requests name their client


def _address(addr: tuple) -> Address:
    return addr[0], addr[1]  # an IPv6 address has flow and scope ids too


class Listener(socket.socket):
    """A listening TCP socket that accepts at most per_client open connections from one host."""

    def __init__(self, host: str, port: int, per_client: int) -> None:
        """Bound to host:port (port 0: any free one) and listening; OSError if it cannot be."""
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        super().__init__(family, socket.SOCK_STREAM)
        self.per_client = per_client
        self.open: Counter[str] = Counter()  # host -> its connections open now
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
        """The next waiting connection under its host's cap; those over it are closed on the way."""
        while True:
            fd, addr = self._accept()  # type: ignore[attr-defined] # socket.socket's own, undocumented
            host = addr[0]
            if self.open[host] < self.per_client:
                break
            socket.close(fd)
            now = time.monotonic()
            if now - self._warned.get(host, -math.inf) > WARN_EVERY_S:
                self._warned[host] = now
                log.warning("%r holds %d HTTP connections: more are closed at once", host, self.per_client)
        self.open[host] += 1
        self._ready[_address(addr)] = time.monotonic()
        return _Connection(self, _address(addr), self.family, self.type, self.proto, fd), addr

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
