"""The coordinator's HTTP API served by hypercorn: an event loop that reads requests, a few worker threads
that run the Flask app on whole ones, TLS.

Why hypercorn: a server whose threads read requests (cheroot, as before) gives each slow client a thread
for as long as it keeps sending, and sixteen of them stopped the API. An asyncio server reads every
request on one event loop, where a slow client costs a coroutine; hypercorn is kept up, parses HTTP with
h11 and serves TLS, which waitress (the other server that reads a whole request before a worker sees it)
does not. hypercorn does not bound a request's time once its headers are in, nor the connections per
client, nor read a body only once it is wanted: the bridge (request_reading) and the listening socket
(listening_socket) add those. Its own WSGI adapter is not used: it reads every body whole, unchecked, and
holds a worker while an answer is read.
"""

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from flask import Flask
from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config, Sockets

from fedspeech.coordinator.config import APP_KEY, ServiceConfig
from fedspeech.coordinator.http.api import BODY_RULES
from fedspeech.coordinator.http.body_rules import Rules
from fedspeech.coordinator.http.listening_socket import Listener, connection_cap
from fedspeech.coordinator.http.request_reading import Bridge

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024  # request line and headers
STOP_S = 3.0  # what requests in progress are given to finish when the server stops


@dataclass
class HttpServer:
    """A running HTTP server: its URL and port, and stop()."""

    url: str
    port: int
    _loop: asyncio.AbstractEventLoop
    _stopping: asyncio.Event
    _thread: threading.Thread

    def stop(self) -> None:
        """Stop accepting, give the requests in progress a few seconds, and end the threads."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=STOP_S + 7)


def _hypercorn_config(service: ServiceConfig) -> Config:
    """hypercorn's settings from the service's; ValueError or ssl.SSLError for TLS files it cannot use."""
    config = Config()
    config.keep_alive_timeout = service.http_timeout  # headers within it of the connection's readiness
    config.ssl_handshake_timeout = service.http_timeout
    config.h11_max_incomplete_size = MAX_HEADER_BYTES
    # pieces of a body read ahead of the bridge (64 KiB each): none is read before the route's rule says yes
    config.max_app_queue_size = 1
    config.graceful_timeout = STOP_S
    config.alpn_protocols = ["http/1.1"]
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = log
    if service.tls_cert is not None and service.tls_key is not None:
        for path in (service.tls_cert, service.tls_key):
            if not path.is_file():
                raise ValueError(f"no such file: {path}")
        config.certfile, config.keyfile = str(service.tls_cert), str(service.tls_key)
        config.create_ssl_context()  # loads both now: a certificate it cannot use fails in the caller
    return config


def _quiet_cancellations(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's errors logged, but for connections cancelled as the server stops (Python 3.11 logs them)."""
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)


def serve(app: Flask, host: str, port: int, rules: Rules = BODY_RULES) -> HttpServer:
    """Serve the app from a background thread (port 0: any free port), as its config's service says; rules:
    what its routes take as bodies (the API's).

    http_threads workers run requests that have arrived whole; each must arrive within http_timeout seconds;
    http_connections_per_client connections per address, http_connections in all; bodies held at once
    within http_body_budget; HTTPS when tls_cert and tls_key name a certificate and its key. A port that
    is taken or not allowed, or TLS files that cannot be used, fail here, in the caller.
    """
    service: ServiceConfig = app.config[APP_KEY].service
    config = _hypercorn_config(service)
    most = connection_cap(service.http_connections)
    if most < service.http_connections:
        log.warning(
            "at most %d HTTP connections at once, not %d: the limit of open files leaves no more (raise it, "
            "e.g. LimitNOFILE= in a systemd unit)", most, service.http_connections,
        )  # fmt: skip
    listener = Listener(host, port, service.http_connections_per_client, most)
    bridge = Bridge(
        app, rules, listener, timeout_s=service.http_timeout, body_budget=service.http_body_budget
    )
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(_quiet_cancellations)
    workers = ThreadPoolExecutor(service.http_threads, thread_name_prefix="http")
    loop.set_default_executor(workers)  # hypercorn runs the bridge's blocking calls there
    stopping = asyncio.Event()
    tls = config.ssl_enabled
    sockets = Sockets([listener] if tls else [], [] if tls else [listener], [])

    def run() -> None:
        try:
            loop.run_until_complete(
                worker_serve(bridge, config, sockets=sockets, shutdown_trigger=stopping.wait)
            )
        except Exception:
            log.exception("the HTTP server stopped")
        finally:
            workers.shutdown(wait=False, cancel_futures=True)
            listener.close()
            loop.close()

    bound_port = listener.getsockname()[1]
    thread = threading.Thread(target=run, name="http", daemon=True)
    thread.start()
    url = f"{'https' if tls else 'http'}://{host}:{bound_port}"
    log.info(
        "coordinator HTTP API on %s (%d threads, %g s per request, %d connections per client, %d in all)",
        url, service.http_threads, service.http_timeout, service.http_connections_per_client, most,
    )  # fmt: skip
    return HttpServer(url, bound_port, loop, stopping, thread)
