"""A TCP proxy that adds real latency and paces bandwidth, to put an emulated network in front of a device.

Kernel netem is not available everywhere (containers, CI), so the delay is added in user space: each
chunk read from one side is written to the other delay_ms / 2 after it arrived, in order, and with a
bandwidth set each direction's bytes leave no faster than that rate. Protocol-agnostic: MQTT, HTTP and
anything else over TCP pass through unchanged. The connection handshake itself is not delayed (the
kernel completes it), so the added latency shows on every request/response exchange, as a device's
measured round-trip does.
"""

import asyncio
import contextlib
import logging
import threading
import time

log = logging.getLogger(__name__)

_READ_SIZE = 64 * 1024
_QUEUE_CHUNKS = 64  # at most this many chunks (4 MiB) wait in the proxy per direction
_PACE_CHUNK = 1024  # with a bandwidth set, bytes are released at least this many at a time
_PACE_SLICE_S = 0.005


class DelayProxy:
    """Listen on 127.0.0.1:<port> and forward each connection to (host, port) with delay and pacing."""

    def __init__(
        self,
        host: str,
        port: int,
        delay_ms: float = 0.0,
        bandwidth_kbps: float | None = None,
        listen_host: str = "127.0.0.1",
    ) -> None:
        if delay_ms < 0:
            raise ValueError(f"delay_ms must not be negative, got {delay_ms}")
        if bandwidth_kbps is not None and bandwidth_kbps <= 0:
            raise ValueError(f"bandwidth_kbps must be positive or None, got {bandwidth_kbps}")
        self.upstream = (host, port)
        self.delay_ms = float(delay_ms)
        self.bandwidth_kbps = bandwidth_kbps
        self.listen_host = listen_host
        self._port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._connections: set[asyncio.Task] = set()

    @property
    def port(self) -> int:
        """The port the proxy listens on (chosen by the OS); only valid after start()."""
        if self._port is None:
            raise RuntimeError("proxy not started")
        return self._port

    def start(self) -> "DelayProxy":
        """Start the event loop thread and return once the proxy is listening."""
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        self._thread = threading.Thread(target=self._run, name=f"delay-proxy-{self.upstream[1]}", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"proxy could not listen: {self._error}") from self._error
        return self

    def stop(self) -> None:
        """Close the listener and every open connection, and end the thread."""
        if self._loop is None or self._thread is None:
            return
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> "DelayProxy":
        """Start the proxy (see start)."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop the proxy (see stop)."""
        self.stop()

    # ---- event loop side ----

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, self.listen_host, 0, reuse_address=True)
            )
            self._port = self._server.sockets[0].getsockname()[1]
        except OSError as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:  # always, inside a connection handler
            self._connections.add(task)
        upstream_writer = None
        try:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            except OSError as exc:
                log.debug("proxy to %s:%s: upstream refused: %s", *self.upstream, exc)
                return
            pumps = [
                asyncio.ensure_future(self._pump(client_reader, upstream_writer)),
                asyncio.ensure_future(self._pump(upstream_reader, client_writer)),
            ]
            try:
                # both directions end at EOF; a reset on either side ends the whole connection
                await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    writer.close()
            self._connections.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction: read as data comes, release each chunk half the delay later, paced."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUE_CHUNKS)

        async def receive() -> None:
            while True:
                data = await reader.read(_READ_SIZE)
                await queue.put((time.monotonic(), data))
                if not data:
                    return

        tasks = [asyncio.ensure_future(receive()), asyncio.ensure_future(self._send(queue, writer))]
        try:
            # returns when both are done, or as soon as one fails (a dead sender must not leave the
            # reader blocked on a full queue)
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if (error := task.exception()) is not None:
                    raise error
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _send(self, queue: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        one_way = self.delay_ms / 2000.0
        bytes_per_s = self.bandwidth_kbps * 1000.0 / 8.0 if self.bandwidth_kbps else None
        link_free_at = 0.0  # when the paced link has finished sending what it was given
        # release about 5 ms of traffic at a time (at least 1 KiB): smooth, without a wake-up per packet
        piece_size = max(_PACE_CHUNK, int(bytes_per_s * _PACE_SLICE_S)) if bytes_per_s else 0
        while True:
            arrived, data = await queue.get()
            wait = arrived + one_way - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:  # EOF from the other side: half-close, as the sender did
                with contextlib.suppress(OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            if bytes_per_s is None:
                writer.write(data)
                await writer.drain()
                continue
            for offset in range(0, len(data), piece_size):
                piece = data[offset : offset + piece_size]
                now = time.monotonic()
                # a late wake-up is made up for (up to one slice), so sleep overshoot does not add up
                link_free_at = max(link_free_at, now - _PACE_SLICE_S) + len(piece) / bytes_per_s
                # the piece is on the wire once the link has clocked it out
                if link_free_at > now:
                    await asyncio.sleep(link_free_at - now)
                writer.write(piece)
                await writer.drain()
