"""A revoked device's daemon is told and stops with one line, rather than waiting for tasks forever; once
stopped it stays so, and does not come back as a new device under open enrolment."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import paho.mqtt.publish as publish
import pytest

from fedspeech.coordinator.app import create_app, serve
from fedspeech.coordinator.fleet.enrolment import revoke_device
from fedspeech.edge_client import ClientConfig, DataSource, Refused, run_client
from fedspeech.protocol import messages
from fedspeech.protocol.messages import DeviceStatus
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import Topics
from tests.helpers.configs import coordinator_config
from tests.helpers.device_doubles import retained
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.timeout(180)


@contextmanager
def _daemon(config: ClientConfig) -> Iterator[tuple[threading.Thread, list[BaseException]]]:
    """run_client in a thread; what it raised lands in the list; stopped and joined on exit."""
    stop, raised = threading.Event(), []

    def run() -> None:
        try:
            run_client(config, stop)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield thread, raised
    finally:
        stop.set()
        thread.join(30)


def test_a_revoked_daemon_is_told_and_stops_with_one_line(tmp_path, mosquitto_url, topic_root):
    # the HTTP API only: the round loop is left out, so no task ever comes, as none comes to a revoked device
    app = create_app(coordinator_config(tmp_path, broker=mosquitto_url, open_enrolment=True))
    store = app.extensions["fedspeech"].store
    server = serve(app, "127.0.0.1", 0)
    config = ClientConfig(
        coordinator_url=server.url,
        broker=BrokerSettings(mosquitto_url),
        device_id="kitchen",
        data=DataSource(corpus="fsdd", speaker="jackson"),
        state_dir=tmp_path / "device",
        topic_root=topic_root,
        max_samples=20,
        token_check_s=0.5,
    )
    topics = Topics(topic_root)
    try:
        with _daemon(config) as (thread, raised):
            wait_for(lambda: "kitchen" in store.registered() or raised, 120, "the device to register")
            time.sleep(1.5)  # a few of its checks pass while it is enrolled
            assert thread.is_alive() and not raised
            assert revoke_device(store, "kitchen")
            revoked_at = time.monotonic()
            thread.join(15)
            assert not thread.is_alive(), "the daemon stopped by itself"
        stopped_after = time.monotonic() - revoked_at
        (exc,) = raised
        assert isinstance(exc, Refused) and "\n" not in str(exc)
        assert "revoked kitchen" in str(exc) and "`fedspeech devices add kitchen`" in str(exc)
        assert stopped_after < 5.0
        status = retained(topics.status("kitchen"), port=1883)
        assert status is not None and messages.decode(status, DeviceStatus).state == "offline"

        with _daemon(config) as (thread, raised):  # started again, with its revoked token kept
            thread.join(120)
        (exc,) = raised
        assert isinstance(exc, Refused) and "revoked kitchen" in str(exc)
        assert store.device("kitchen") is None, "it did not register as a new device"
    finally:
        server.stop()
        publish.single(topics.status("kitchen"), b"", retain=True, hostname="127.0.0.1", port=1883)
