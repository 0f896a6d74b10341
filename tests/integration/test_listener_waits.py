"""A listener following a coordinator says why it waits for its first model, once per reason, and takes
the coordinator's model over HTTP as soon as there is one, whatever the broker retains or loses.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.coordinator.app import create_app, serve
from fedspeech.protocol import messages, routes, signing
from fedspeech.protocol.messages import ModelAnnouncement
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import Topics
from fedspeech.runtime import model_follower
from fedspeech.runtime.model_follower import ModelFollower
from fedspeech.runtime.session import OnnxModel
from fedspeech_bench.attacks.strangers import Stranger
from tests.helpers.configs import coordinator_config
from tests.helpers.coordinators import running_coordinator
from tests.helpers.ports import free_port
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.timeout(180)

RUNTIME = "fedspeech.runtime"
SETTINGS = {"eval_corpus": None, "eval_every": 0, "min_devices": 1, "rounds": 1}  # no device ever comes


@contextmanager
def coordinator_on(tmp_path: Path, port: int, broker_url: str, topic_root: str) -> Iterator:
    """A coordinator whose HTTP API answers on port before its service (its round loop) is started: it has
    announced no model until the test starts the service it yields.
    """
    config = coordinator_config(tmp_path, broker=broker_url, topic_root=topic_root, **SETTINGS)
    app = create_app(config)
    service = app.extensions["fedspeech"]
    server = serve(app, "127.0.0.1", port)
    try:
        yield service
    finally:
        server.stop()
        service.stop()


@pytest.fixture
def asks(monkeypatch) -> list[str]:
    """The coordinators a follower asks for their latest announcement, one entry per question."""
    asked: list[str] = []
    fetch_announcement = model_follower.fetch_announcement

    def recorded(base_url: str, *args, **kwargs) -> ModelAnnouncement | None:
        asked.append(base_url)
        return fetch_announcement(base_url, *args, **kwargs)

    monkeypatch.setattr(model_follower, "fetch_announcement", recorded)
    return asked


def lines(caplog: pytest.LogCaptureFixture, text: str, level: int = logging.INFO) -> list[str]:
    """The listener's log lines at level that hold text."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(RUNTIME) and r.levelno == level and text in r.getMessage()
    ]


def first_model(follower: ModelFollower, timeout: float = 60.0) -> OnnxModel:
    """The first model the follower loads."""
    return wait_for(lambda: follower.model, timeout, "the listener's first model", interval=0.1)


def test_a_listener_started_first_says_why_it_waits_and_takes_the_first_model_over_http(
    tmp_path, mosquitto_url, topic_root, asks, caplog
):
    caplog.set_level(logging.INFO, logger=RUNTIME)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "state").mkdir()  # the coordinator's key made first, to be pinned
    key = signing.public_key_text(signing.load_or_create_key(tmp_path / "state" / "coordinator.key"))
    # the listener hears nothing on its broker: the coordinator's announcement is lost to it
    deaf = BrokerSettings(f"mqtt://127.0.0.1:{free_port()}")
    follower = ModelFollower(url, deaf, topic_root, key, state_dir=tmp_path / "listen")
    follower.start()
    try:
        refused = f"no model yet: cannot ask {url}{routes.ANNOUNCEMENT}: connection refused; asking again"
        wait_for(lambda: len(asks) >= 3, 20, "the listener to ask the absent coordinator three times")
        assert len(lines(caplog, refused, logging.WARNING)) == 1, "said once, not at each question"

        with coordinator_on(tmp_path, port, mosquitto_url, topic_root) as service:
            none_yet = f"no model yet: the coordinator at {url} has announced none yet"
            wait_for(lambda: lines(caplog, none_yet), 20, "the listener to say the coordinator has none")
            asked = len(asks)
            wait_for(lambda: len(asks) >= asked + 2, 30, "two more questions")
            assert len(lines(caplog, none_yet)) == 1 and follower.model is None

            service.start()  # round 0, the first model, is announced on the broker and over HTTP
            assert first_model(follower).describe().endswith("round 0")
    finally:
        follower.stop()
    assert len(lines(caplog, refused, logging.WARNING)) == 1


def test_a_retained_announcement_signed_by_another_key_is_one_warning_and_the_genuine_model_is_taken(
    tmp_path, mosquitto_url, topic_root, caplog
):
    caplog.set_level(logging.INFO, logger=RUNTIME)
    topics = Topics(topic_root)
    stranger = Stranger(mosquitto_url, topics)
    settings = {**SETTINGS, "broker": mosquitto_url, "topic_root": topic_root}
    try:
        with running_coordinator(tmp_path, **settings) as (service, url):
            wait_for(lambda: 0 in stranger.announcements, 60, "the coordinator's round 0 announced")
            body = signing.verify(service.key.public_key(), topics.model, stranger.announcements[0])
            # another coordinator on the same topic root announces its own model, retained in place of it
            other = Ed25519PrivateKey.generate()
            stranger.publish(topics.model, signing.sign(other, topics.model, body), retain=True)
            follower = ModelFollower(url, BrokerSettings(mosquitto_url), topic_root)  # it asks for the key
            follower.start()
            try:
                first = first_model(follower)
                assert first.describe().endswith("round 0"), "the genuine one, over HTTP"
                wait_for(lambda: lines(caplog, "signed by another key", logging.WARNING), 10, "the warning")
                # the other coordinator's next round, then the genuine one again: no second warning
                next_one = replace(messages.decode(body, ModelAnnouncement), round=1)
                stranger.publish(topics.model, signing.sign(other, topics.model, messages.encode(next_one)))
                stranger.publish(topics.model, stranger.announcements[0])
                held = "round 0: its model is held already"
                wait_for(lambda: lines(caplog, held), 10, "the genuine announcement heard after the other")
                assert follower.model is first, "nothing else was loaded"
            finally:
                follower.stop()
    finally:
        stranger.close()
    (warning,) = lines(caplog, "signed by another key", logging.WARNING)
    assert warning.startswith(f"the retained announcement on {topics.model} has a bad signature")
    assert f"sent by {url}{routes.KEY}" in warning and "--topic-root" in warning
    assert f"the broker {mosquitto_url} carries another coordinator's models" in warning
    assert "give it the URL of the coordinator that announces on this broker" in warning
    assert f"waiting for a model signed by {signing.public_key_text(service.key)}" in warning
