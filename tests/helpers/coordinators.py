"""A coordinator service running in this process on a real broker, and waiting for its rounds to end."""

from contextlib import contextmanager

from fedspeech.coordinator.app import create_app, serve
from tests.helpers.configs import coordinator_config
from tests.helpers.waiting import wait_for


@contextmanager
def running_coordinator(tmp_path, **config):
    """An in-process coordinator on a free port, open to any device; yields (service, base URL)."""
    defaults = {"eval_corpus": "fsdd", "round_timeout": 120.0, "open_enrolment": True}
    app = create_app(coordinator_config(tmp_path, **defaults).changed(**config))
    service = app.extensions["fedspeech"]
    service.start()
    server = serve(app, "127.0.0.1", 0)
    try:
        yield service, server.url
    finally:
        server.stop()
        service.stop()


def wait_until_finished(service, clients) -> None:
    finished = service.orchestrator.finished
    wait_for(lambda: finished.is_set() or any(p.poll() is not None for p in clients), 240, "rounds")
    assert finished.is_set(), "a device process died"
    assert all(p.poll() is None for p in clients), "device processes keep running between rounds"
