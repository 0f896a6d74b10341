"""A stranger with no credentials on an open (anonymous) broker, against an in-process coordinator and the
device's and listener's own code: it withdraws no task, holds no round to its deadline, rolls no new
listener or keeper back to an old model and leaves no new listener without one, even across a restart.
"""

import logging
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fedspeech.edge_client import coordinator_http
from fedspeech.edge_client.coordinator_http import CoordinatorClient
from fedspeech.edge_client.credentials import DeviceCredentials
from fedspeech.edge_client.model_keeper import KEPT_ANNOUNCEMENT, ModelKeeper
from fedspeech.edge_client.mqtt_link import BrokerLink
from fedspeech.protocol import messages, routes, signing
from fedspeech.protocol.messages import (
    BlobRef,
    Credentials,
    DeviceStatus,
    ModelAnnouncement,
    Profile,
    Registration,
)
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import Topics
from fedspeech.runtime import model_follower
from fedspeech.runtime.announcements import FLOOR_FILE, Floor
from fedspeech.runtime.model_follower import ModelFollower
from fedspeech.runtime.session import OnnxModel
from fedspeech_bench.attacks.strangers import Stranger
from tests.helpers.coordinators import running_coordinator
from tests.helpers.device_doubles import retained
from tests.helpers.devices import ScriptedDevice, post, unchanged_update, upload
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.timeout(180)

ROUND_TIMEOUT_S = 60.0  # what a round would wait for a device that is not there, without acknowledgements
ACK_TIMEOUT_S = 5.0  # where a test counts on it; elsewhere 30 s, so that a busy machine fails no round
SAMPLES = 40


@contextmanager
def coordinator(tmp_path: Path, broker_url: str, topic_root: str, **settings) -> Iterator[tuple]:
    """An in-process coordinator on the machine's Mosquitto, open to any device, no central evaluation."""
    config = {
        "broker": broker_url, "topic_root": topic_root, "eval_corpus": None, "eval_every": 0,
        "min_devices": 1, "min_results": 1, "round_timeout": ROUND_TIMEOUT_S, "ack_timeout": 30.0,
    }  # fmt: skip
    with running_coordinator(tmp_path, **{**config, **settings}) as (service, url):
        yield service, url


def register(url: str, device_id: str) -> str:
    """Register a device over HTTP; its token."""
    body = messages.encode(Registration(device_id, SAMPLES, Profile(1, 0.0, 256.0)))
    request = urllib.request.Request(f"{url}/api/devices", body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return messages.decode(reply.read(), Credentials).token


def run_rounds(service, url: str, device: ScriptedDevice, rounds: int) -> None:
    """The honest device takes and answers each round's task until the coordinator is finished."""
    device.register(url, SAMPLES)
    device.go_online(SAMPLES)
    for _ in range(rounds):
        assert device.send_back_unchanged(url, device.next_task(60), SAMPLES) == 200
    wait_for(service.orchestrator.finished.is_set, 60, "the rounds to finish")


def first_model(follower: ModelFollower, timeout: float = 30.0) -> OnnxModel:
    """The first model the follower loads."""
    return wait_for(lambda: follower.model, timeout, "the listener's first model", interval=0.1)


@pytest.fixture
def downloads(monkeypatch) -> list[str]:
    """The paths of the blobs a listener or a keeper downloads, in order."""
    paths: list[str] = []
    fetch_blob = coordinator_http.fetch_blob

    def recorded(base_url: str, ref: BlobRef, *args, **kwargs) -> bytes:
        paths.append(ref.path)
        return fetch_blob(base_url, ref, *args, **kwargs)

    monkeypatch.setattr(coordinator_http, "fetch_blob", recorded)
    monkeypatch.setattr(model_follower, "fetch_blob", recorded)
    return paths


def test_an_unsigned_empty_message_withdraws_no_task_and_the_coordinators_signed_withdrawal_does(
    tmp_path, mosquitto_url, topic_root, caplog
):
    caplog.set_level(logging.INFO, logger="fedspeech.edge_client.mqtt_link")
    topics = Topics(topic_root)
    stranger = Stranger(mosquitto_url, topics)
    with coordinator(tmp_path, mosquitto_url, topic_root, rounds=1) as (service, url):
        token = register(url, "kitchen")
        link = BrokerLink(BrokerSettings(mosquitto_url), topics, "kitchen", service.key.public_key())
        try:
            link.start(DeviceStatus("kitchen", "online", SAMPLES))
            task = link.tasks.get(timeout=60)
            stranger.publish(topics.task("kitchen"), b"", retain=True)  # clears the retained signed task
            wait_for(lambda: "nothing is withdrawn" in caplog.text, 10, "the empty message")
            assert not link.withdrawn(task), "an unsigned empty message withdrew the task"
            # so the device does its task, and the round takes its result
            assert post(f"{url}{routes.ack(task.task_id)}", b"", {"Authorization": f"Bearer {token}"}) == 200
            assert upload(url, task.upload_path, token, unchanged_update(url, task, SAMPLES)) == 200
            wait_for(service.orchestrator.finished.is_set, 60, "the round")
            # the round closed: the coordinator withdraws the task, signed, in place of the retained one
            wait_for(lambda: link.withdrawn(task), 10, "the coordinator's signed withdrawal")
        finally:
            link.go_offline()
            stranger.close()
    assert service.store.rounds()[1].results == 1


def test_a_forged_online_status_costs_a_round_its_ack_timeout_not_its_deadline(
    tmp_path, mosquitto_url, topic_root
):
    topics = Topics(topic_root)
    stranger = Stranger(mosquitto_url, topics)
    honest = ScriptedDevice("honest", mosquitto_url, topics)
    settings = {"rounds": 1, "min_devices": 2, "ack_timeout": ACK_TIMEOUT_S}
    with coordinator(tmp_path, mosquitto_url, topic_root, **settings) as (service, url):
        try:
            register(url, "switched-off")  # enrolled, and down
            status = DeviceStatus("switched-off", "online", SAMPLES)
            stranger.publish(topics.status("switched-off"), messages.encode(status), retain=True)
            run_rounds(service, url, honest, rounds=1)
        finally:
            honest.close()
            stranger.close()
    record = service.store.rounds()[1]
    print(f"round 1 with a forged online device: {record.wall_s:.2f} s (deadline {ROUND_TIMEOUT_S:.0f} s)")
    assert (record.devices, record.results, record.withdrawn) == (2, 1, 1), "the forged device is gone"
    assert record.wall_s < ROUND_TIMEOUT_S / 2, "the round waited for a device that never took its task"


def test_a_replayed_old_announcement_rolls_back_neither_a_new_listener_nor_a_new_keeper(
    tmp_path, mosquitto_url, topic_root, downloads
):
    topics = Topics(topic_root)
    stranger = Stranger(mosquitto_url, topics)
    honest = ScriptedDevice("honest", mosquitto_url, topics)
    with coordinator(tmp_path, mosquitto_url, topic_root, rounds=2) as (service, url):
        key = signing.public_key_text(service.key)
        try:
            run_rounds(service, url, honest, rounds=2)
            stranger.publish(topics.model, stranger.announcements[0], retain=True)  # genuine, of round 0
            assert retained(topics.model) == stranger.announcements[0]
            follower = ModelFollower(url, BrokerSettings(mosquitto_url), topic_root, key, state_dir=tmp_path)
            follower.start()
            try:
                assert first_model(follower).describe().endswith("round 2")
            finally:
                follower.stop()
            assert downloads == [routes.model(2, "frontend"), routes.model(2, "classifier")]  # its pair

            downloads.clear()
            kept = _keep(url, mosquitto_url, topics, key, tmp_path / "device", tmp_path / "models")
            assert kept == 2 and downloads == [routes.model(2, "onnx")]
        finally:
            honest.close()
            stranger.close()


def _keep(url: str, broker_url: str, topics: Topics, key: str, state: Path, models: Path) -> int:
    """A device's model keeper started now, once it keeps a model and some seconds have passed: that round."""
    stop = threading.Event()
    http = CoordinatorClient(url, "keeper", stop, DeviceCredentials(state, key))
    keeper = ModelKeeper(models, topic=topics.model, floor=Floor(state / FLOOR_FILE, key, topics.model))
    link = BrokerLink(
        BrokerSettings(broker_url), topics, "keeper", http.credentials.key,
        on_announcement=keeper.offer, on_connected=keeper.recheck,
    )  # fmt: skip
    link.start(DeviceStatus("keeper", "online"))
    try:
        deadline, settled = time.monotonic() + 30, None
        while settled is None or time.monotonic() < settled:  # then 2 s more, for anything else retained
            assert time.monotonic() < deadline, "the keeper kept no model"
            keeper.keep(http)
            if settled is None and keeper.kept_round >= 0:
                settled = time.monotonic() + 2.0
            time.sleep(0.1)
    finally:
        stop.set()
        link.go_offline()
    kept = messages.decode((models / KEPT_ANNOUNCEMENT).read_bytes(), ModelAnnouncement)
    assert kept.round == keeper.kept_round
    return kept.round


def test_a_forged_or_empty_retained_announcement_leaves_no_new_listener_without_a_model(
    tmp_path, mosquitto_url, topic_root, caplog
):
    topics = Topics(topic_root)
    stranger = Stranger(mosquitto_url, topics)
    honest = ScriptedDevice("honest", mosquitto_url, topics)
    with coordinator(tmp_path, mosquitto_url, topic_root, rounds=1) as (service, url):
        try:
            run_rounds(service, url, honest, rounds=1)
            signed = signing.verify(service.key.public_key(), topics.model, stranger.announcements[1])
            genuine = messages.decode(signed, ModelAnnouncement)
            forged = ModelAnnouncement(99, genuine.spec, genuine.labels, genuine.weights)
            # an announcement of its own, unsigned, in place of the coordinator's; then nothing at all
            for retained in (messages.encode(forged), b""):
                stranger.publish(topics.model, retained, retain=True)
                follower = ModelFollower(url, BrokerSettings(mosquitto_url), topic_root)
                follower.start()  # a new listener, given no key: it asks the coordinator for it
                try:
                    if retained:
                        wait_for(lambda: "not a signed message" in caplog.text, 10, "the forgery dropped")
                    assert first_model(follower).describe().endswith("round 1")
                finally:
                    follower.stop()
        finally:
            honest.close()
            stranger.close()


def test_the_floor_survives_a_restart_of_the_listener(tmp_path, mosquitto_url, topic_root, downloads, caplog):
    topics = Topics(topic_root)
    stranger = Stranger(mosquitto_url, topics)
    honest = ScriptedDevice("honest", mosquitto_url, topics)
    try:
        with coordinator(tmp_path, mosquitto_url, topic_root, rounds=1) as (service, url):
            key = signing.public_key_text(service.key)
            try:
                run_rounds(service, url, honest, rounds=1)
                follower = ModelFollower(
                    url, BrokerSettings(mosquitto_url), topic_root, key, state_dir=tmp_path
                )
                follower.start()
                try:
                    assert first_model(follower).describe().endswith("round 1")
                finally:
                    follower.stop()
            finally:
                honest.close()
        # the coordinator is gone (it cannot be asked), and round 0's genuine announcement is replayed
        stranger.publish(topics.model, stranger.announcements[0], retain=True)
        downloads.clear()
        restarted = ModelFollower(url, BrokerSettings(mosquitto_url), topic_root, key, state_dir=tmp_path)
        restarted.start()
        try:
            wait_for(
                lambda: "round 0: ignoring it, round 1 is newer" in caplog.text, 20, "the replay refused"
            )
            assert restarted.model is None
        finally:
            restarted.stop()
    finally:
        stranger.close()
    assert downloads == [], "the restarted listener tried to load the old model"
