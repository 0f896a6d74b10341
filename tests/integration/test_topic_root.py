"""One broker, several coordinators: a topic root is one coordinator's, unless another is told to take it.

In-process coordinators on the machine's Mosquitto, each test on a topic root of its own.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from fedspeech.coordinator.app import Service, TopicRootTaken, create_app
from fedspeech.protocol import signing
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.topics import Topics
from tests.helpers.configs import coordinator_config
from tests.helpers.device_doubles import retained
from tests.helpers.waiting import wait_for


def _service(folder: Path, mosquitto_url: str, topic_root: str, **settings) -> Service:
    """A coordinator on its own state in folder, on the machine's broker; not started."""
    config = coordinator_config(folder, broker=mosquitto_url, topic_root=topic_root, **settings)
    return create_app(config).extensions["fedspeech"]


@contextmanager
def _running(service: Service) -> Iterator[Service]:
    service.start()
    try:
        yield service
    finally:
        service.stop()


def _signed_by(service: Service, topic: str) -> bool:
    """Whether the announcement retained on topic is signed with service's key."""
    payload = retained(topic)
    if not payload:
        return False
    try:
        signing.verify(service.key.public_key(), topic, payload)
    except ProtocolError:
        return False
    return True


@pytest.fixture
def model_topic(topic_root) -> Iterator[str]:
    """The topic root's model topic, its retained announcement cleared at the end."""
    topic = Topics(topic_root).model
    yield topic
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", 1883)
    client.loop_start()
    client.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)
    client.disconnect()
    client.loop_stop()


def test_a_second_coordinator_on_a_topic_root_is_refused_until_told_to_take_it_over(
    tmp_path, mosquitto_url, topic_root, model_topic
):
    first = _service(tmp_path / "first", mosquitto_url, topic_root)
    with _running(first):
        wait_for(lambda: _signed_by(first, model_topic), 60, "the first coordinator's announcement")

    # the same coordinator again (its state, its key): its own announcement is no one else's
    with _running(_service(tmp_path / "first", mosquitto_url, topic_root)) as again:
        assert again.link.checked.is_set() and again.link.refusal is None

    second = _service(tmp_path / "second", mosquitto_url, topic_root)
    with pytest.raises(TopicRootTaken, match="--topic-root") as refused:
        second.start()
    assert "--take-over-topic-root" in str(refused.value) and topic_root in str(refused.value)
    assert second.thread is None, "no round loop started"
    assert _signed_by(first, model_topic), "the first coordinator's announcement is left as it was"

    taker = _service(tmp_path / "second", mosquitto_url, topic_root, take_over_topic_root=True)
    with _running(taker):
        wait_for(lambda: _signed_by(taker, model_topic), 60, "the announcement of the one taking over")


def test_a_coordinator_announces_nothing_before_it_has_checked_the_topic_root(
    tmp_path, mosquitto_url, topic_root, model_topic
):
    other = _service(tmp_path / "other", mosquitto_url, topic_root)
    with _running(other):
        wait_for(lambda: _signed_by(other, model_topic), 60, "the other coordinator's announcement")
    late = _service(tmp_path / "late", mosquitto_url, topic_root)
    late.orchestrator._resume()  # the round loop's first announcement, made before the link connects
    late.link.start()
    try:
        wait_for(lambda: late.link.checked.is_set(), 30, "the topic root's check")
        assert late.link.refusal is not None and "--take-over-topic-root" in late.link.refusal
        assert _signed_by(other, model_topic), "the announcement held back was never published"
    finally:
        late.link.stop()


def test_of_two_coordinators_started_on_one_topic_root_at_once_the_later_to_announce_stops(
    tmp_path, mosquitto_url, topic_root, model_topic, caplog
):
    # both check the root before either has announced: nothing is retained there, both pass
    first = _service(tmp_path / "first", mosquitto_url, topic_root)
    second = _service(tmp_path / "second", mosquitto_url, topic_root)
    for service in (first, second):
        service.link.start()
    try:
        wait_for(lambda: first.link.checked.is_set() and second.link.checked.is_set(), 30, "both checks")
        assert first.link.refusal is None and second.link.refusal is None
        first.orchestrator._resume()  # the first's round 0 announced: the second hears it before its own
        wait_for(lambda: second.link.refusal is not None, 60, "the second to find the first's announcement")
        assert "another coordinator announced a model on the topic root" in second.link.refusal
        assert topic_root in second.link.refusal and "--topic-root" in second.link.refusal
        second.orchestrator._resume()  # its own round 0: held back, never published
        assert _signed_by(first, model_topic) and first.link.refusal is None
        assert "another coordinator announces models" not in caplog.text, "the first heard no rival"
    finally:
        first.link.stop()
        second.link.stop()
