"""A device that cannot do its task says so at once, with its token: the round goes on without waiting for
it, and the operator sees why in status, the overview and `fedspeech status`. A forged report changes
nothing. A real coordinator on the machine's Mosquitto, a real device daemon and a device the test speaks
for."""

import json
import shutil
import threading
import time

import pytest

from fedspeech.edge_client import ClientConfig, DataSource, run_client
from fedspeech.protocol import messages, routes
from fedspeech.protocol.messages import TaskFailure
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import Topics
from fedspeech.status import render
from tests.helpers.coordinators import running_coordinator
from tests.helpers.devices import ScriptedDevice, post
from tests.helpers.recordings import copy_takes
from tests.helpers.waiting import get_json, wait_for

pytestmark = pytest.mark.timeout(180)

ROUND_TIMEOUT_S = 300.0  # a round that waited for its deadline would outlast the test


def _one_round(tmp_path, mosquitto_url: str, topic_root: str):
    """A coordinator of one round for two devices, taking one result; its deadline far away."""
    return running_coordinator(
        tmp_path, broker=mosquitto_url, topic_root=topic_root, eval_corpus=None, eval_every=0,
        rounds=1, min_devices=2, min_results=1, k=2, round_timeout=ROUND_TIMEOUT_S, ack_timeout=600.0,
    )  # fmt: skip


def _failure(url: str, task_id: str, token: str | None, reason: str = "forged") -> int:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    return post(url + routes.failure(task_id), messages.encode(TaskFailure(reason)), headers)


def test_a_task_that_fails_on_a_device_ends_its_wait_and_shows_why(tmp_path, mosquitto_url, topic_root):
    folder = tmp_path / "recordings"
    copy_takes(folder, "01", range(3))
    config = ClientConfig(
        coordinator_url="",
        broker=BrokerSettings(mosquitto_url),
        device_id="shed",
        data=DataSource(folder=folder),
        state_dir=tmp_path / "shed",
        topic_root=topic_root,
    )
    steady = ScriptedDevice("porch", mosquitto_url, Topics(topic_root))
    stop = threading.Event()
    with _one_round(tmp_path, mosquitto_url, topic_root) as (service, url):
        config.coordinator_url = url
        daemon = threading.Thread(target=run_client, args=(config, stop), daemon=True)
        daemon.start()
        try:
            wait_for(lambda: "shed" in service.link.online(), 60, "the daemon to go online")
            shutil.rmtree(folder)  # the device's recordings go (a disk unmounted): its task cannot be done
            steady.register(url, 20)
            steady.go_online(20)
            task = steady.next_task(60)
            handed_out = time.monotonic()
            assert steady.send_back_unchanged(url, task, 20) == 200
            wait_for(service.orchestrator.finished.is_set, 60, "the round to end without waiting for shed")
            assert time.monotonic() - handed_out < ROUND_TIMEOUT_S / 5
        finally:
            stop.set()
            daemon.join(30)
            steady.close()
        assert not daemon.is_alive()

        round_1 = get_json(f"{url}/api/rounds")[1]
        assert (round_1["devices"], round_1["results"], round_1["withdrawn"]) == (2, 1, 1)
        errors = get_json(f"{url}/api/status")["device_errors"]
        assert list(errors) == ["shed"] and errors["shed"]["round"] == 1
        assert errors["shed"]["reason"] == f"no data folder {folder}"
        overview = get_json(f"{url}/api/overview")
        shown = {d["device_id"]: d["last_error"] for d in overview["devices"]}
        assert shown["porch"] is None and shown["shed"]["reason"] == f"no data folder {folder}"
        table = render(overview, url, 5)
        assert "LAST ERROR" in table and "round 1: no data folder" in table


def test_a_forged_failure_report_is_refused_and_the_round_still_waits(tmp_path, mosquitto_url, topic_root):
    devices = [ScriptedDevice(d, mosquitto_url, Topics(topic_root)) for d in ("attic", "barn")]
    attic, barn = devices
    try:
        with _one_round(tmp_path, mosquitto_url, topic_root) as (service, url):
            for device in devices:
                device.register(url, 20)
                device.go_online(20)
            tasks = {device.device_id: device.next_task(60) for device in devices}
            attics = tasks["attic"].task_id
            assert _failure(url, attics, None) == 401
            assert _failure(url, attics, "a-guess-at-a-token-0123456789") == 401
            assert _failure(url, attics, barn.token) == 409, "not barn's task"
            assert _failure(url, "not-a-task-of-attic", attic.token) == 409
            headers = {"Authorization": f"Bearer {attic.token}"}
            assert post(url + routes.failure(attics), b"{not json", headers) == 400
            too_long = json.dumps({"v": 1, "kind": "task_failure", "reason": "x" * 301}).encode()
            assert post(url + routes.failure(attics), too_long, headers) == 400
            assert post(url + routes.failure(attics), b" " * 5000, headers) == 413
            time.sleep(1.0)
            assert service.uploads.open_round() == 1, "the round still waits for attic"
            assert service.uploads.last_errors() == {} and not service.orchestrator.finished.is_set()

            assert barn.send_back_unchanged(url, tasks["barn"], 20) == 200
            time.sleep(0.5)
            assert service.uploads.open_round() == 1, "and for attic once barn is in"
            assert attic.send_back_unchanged(url, tasks["attic"], 20) == 200
            wait_for(service.orchestrator.finished.is_set, 60, "the round to end with both updates")
            updates = get_json(f"{url}/api/rounds/1")["updates"]
            assert sorted(u["device_id"] for u in updates) == ["attic", "barn"]
    finally:
        for device in devices:
            device.close()
