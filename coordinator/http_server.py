"""The coordinator's HTTP API served by cheroot: a thread pool, socket timeouts, a body limit, TLS.

The API refuses a request before reading its body when the bearer token is wrong. What the server then
does with the unread body: one of announced length (at most the body limit) is read and thrown away,
within the socket timeout, so that the client, which sends its whole body before it reads the answer,
gets the refusal rather than a reset connection; a chunked one, of no announced length, is not read at
all: the connection is closed.
"""

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from cheroot import errors, wsgi
from flask import Flask
from werkzeug.exceptions import RequestEntityTooLarge

from fedspeech.coordinator.api import MAX_UPDATE_BYTES
from fedspeech.coordinator.config import APP_KEY, ServiceConfig

log = logging.getLogger(__name__)

MAX_BODY_BYTES = MAX_UPDATE_BYTES + 1024 * 1024  # the largest route's limit, and chunk-size lines
MAX_HEADER_BYTES = 64 * 1024  # request line and headers
_DISCARD_PIECE = 64 * 1024


class _ChunkedBody:
    """A chunked request body whose overflow of the server's limit the application sees as a 413 error.

    cheroot reports it as a broken connection (an OSError), which Werkzeug turns into a 400.
    """

    def __init__(self, rfile: Any) -> None:
        self._rfile = rfile

    def read(self, size: int | None = None) -> bytes:
        """Up to size bytes of the body (all of it without size)."""
        try:
            return self._rfile.read(size)
        except errors.MaxSizeExceeded:
            raise RequestEntityTooLarge() from None
        except OSError as exc:
            if exc.args == ("Request Entity Too Large",):  # a chunk whose announced size passes the limit
                raise RequestEntityTooLarge() from None
            raise

    def readline(self, size: int | None = None) -> bytes:
        """A line of the body: what WSGI asks of an input stream besides read."""
        return self._rfile.readline(size)


class _Gateway(wsgi.Gateway_10):
    """cheroot's WSGI gateway, which also deals with a body the application left unread."""

    def get_environ(self) -> dict:  # type: ignore[override] # cheroot's stub says None
        """The WSGI environment, a chunked body wrapped so that its overflow reads as too large."""
        environ = super().get_environ()
        if self.req.chunked_read:
            environ["wsgi.input"] = _ChunkedBody(environ["wsgi.input"])
        return environ

    def respond(self) -> None:
        """Run the application; then discard or refuse what it left of the body; then answer."""
        response = self.req.server.wsgi_app(self.env, self.start_response)
        try:
            self._settle_body()
            for chunk in filter(None, response):
                self.write(chunk)
        finally:
            self.req.ensure_headers_sent()
            if hasattr(response, "close"):
                response.close()

    def _settle_body(self) -> None:
        req = self.req
        if req.chunked_read:
            if not req.rfile.closed:  # the last chunk was not read
                req.close_connection = True
            return
        deadline = time.monotonic() + req.server.timeout
        try:
            while req.rfile.remaining > 0 and time.monotonic() < deadline:
                if not req.rfile.read(min(req.rfile.remaining, _DISCARD_PIECE)):
                    break
        except OSError:  # the client stopped sending: it still gets the answer, if it reads
            pass
        if req.rfile.remaining > 0:
            req.close_connection = True


class _Server(wsgi.Server):
    """cheroot's WSGI server, its messages in this module's log: routine ones at debug level."""

    def error_log(self, msg: str = "", level: int = logging.INFO, traceback: bool = False) -> None:
        """Log what cheroot reports; its per-connection noise (timeouts, resets) only at debug level."""
        log.log(
            logging.ERROR if level >= logging.ERROR else logging.DEBUG,
            "HTTP server: %s",
            msg,
            exc_info=traceback,
        )


@dataclass
class HttpServer:
    """A running HTTP server: its URL and port, and stop()."""

    url: str
    port: int
    _server: wsgi.Server
    _thread: threading.Thread

    def stop(self) -> None:
        """Stop accepting, finish the requests in progress (a few seconds at most) and end the threads."""
        self._server.stop()
        self._thread.join(timeout=10)


def serve(app: Flask, host: str, port: int) -> HttpServer:
    """Serve the app from background threads (port 0: any free port), as its config's service says.

    http_threads requests at a time; a connection silent for http_timeout_s seconds is closed; HTTPS
    when tls_cert and tls_key name a certificate and its key.
    """
    config: ServiceConfig = app.config[APP_KEY].service
    threads, timeout = config.http_threads, config.http_timeout_s
    cert, key = config.tls_cert, config.tls_key
    server = _Server(
        (host, port),
        app,
        numthreads=threads,
        max=threads,
        timeout=timeout,  # type: ignore[arg-type] # a float works; the stub says int
        server_name="fedspeech",
    )
    server.gateway = _Gateway
    server.max_request_body_size = MAX_BODY_BYTES
    server.max_request_header_size = MAX_HEADER_BYTES
    if cert is not None and key is not None:
        from cheroot.ssl.builtin import BuiltinSSLAdapter

        for path in (cert, key):
            if not path.is_file():
                raise ValueError(f"no such file: {path}")
        server.ssl_adapter = BuiltinSSLAdapter(str(cert), str(key))
    server.prepare()  # binds the socket: a port taken or not allowed fails here, in the caller
    bound_port = server.bind_addr[1]
    thread = threading.Thread(target=server.serve, name="http", daemon=True)
    thread.start()
    scheme = "https" if cert is not None else "http"
    url = f"{scheme}://{host}:{bound_port}"
    log.info("coordinator HTTP API on %s (%d threads, %g s timeout)", url, threads, timeout)
    return HttpServer(url, bound_port, server, thread)
