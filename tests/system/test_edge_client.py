"""The device daemon against the machine's Mosquitto and a small HTTP test double of the coordinator.

The double signs tasks and announcements with a real Ed25519 key, as the coordinator does; the helpers here
are shared with test_device_security.py.
"""

import json
import logging
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest

from fedspeech.edge_client import DataSource, run_client
from fedspeech.protocol import messages, signing, weights
from fedspeech.protocol.messages import (
    DeviceStatus,
    EvaluationReport,
    ModelSpec,
    Task,
    TaskWithdrawal,
)
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech_bench.attacks.mosquitto import listening
from tests.helpers.device_doubles import (
    BLOB_PATH,
    MAX_SAMPLES,
    SPEAKER,
    SPEC,
    UPLOAD_PATH,
    CoordinatorDouble,
    Fleet,
    client_args,
    fleet_of,
    make_task,
    retained,
    running_daemon,
    wait_until,
    warnings_about,
)
from tests.helpers.ports import free_port
from tests.helpers.recordings import copy_takes


@pytest.fixture(scope="module")
def reference() -> weights.Arrays:
    from fedspeech.models import build_model
    from fedspeech.models.train import get_arrays

    return get_arrays(build_model(SPEC))


@pytest.fixture
def fleet(reference: weights.Arrays, tmp_path: Path) -> Iterator[Fleet]:
    with fleet_of(CoordinatorDouble(weights.encode(reference)), tmp_path / "device-state") as fleet:
        yield fleet


pytestmark = pytest.mark.timeout(60)


def evaluation(task: Task) -> Task:
    """The task as an evaluation of its round's model."""
    return replace(task, action="evaluate", upload_path="/api/rounds/1/evaluations")


def test_full_task_round_trip(fleet: Fleet, reference: weights.Arrays) -> None:
    coordinator = fleet.coordinator
    with running_daemon(fleet) as (stop, thread):
        assert [r.num_samples for r in coordinator.registrations] == [MAX_SAMPLES]
        online = messages.decode(retained(fleet.topics.status(fleet.device_id)), DeviceStatus)
        assert (online.state, online.num_samples) == ("online", MAX_SAMPLES)
        assert online.profile.cpu_count >= 1 and online.profile.ram_available_mb > 0
        assert online.profile.seconds_per_sample > 0  # measured while warming up, before the first task

        fleet.send_task(make_task("task-1", blob=coordinator.blob))
        wait_until(lambda: coordinator.uploads)
        upload = coordinator.uploads[0]
        assert upload.path == UPLOAD_PATH
        assert upload.headers["Authorization"] == f"Bearer {coordinator.token}"
        assert upload.headers["Content-Type"] == "application/octet-stream"
        assert upload.headers["X-Content-SHA256"] == weights.sha256(upload.body)
        arrays, metadata = weights.decode(upload.body)
        weights.check_like(arrays, reference)
        assert any(not np.array_equal(arrays[name], reference[name]) for name in reference)
        assert metadata["task_id"] == "task-1" and metadata["device_id"] == fleet.device_id
        assert metadata["num_samples"] == str(MAX_SAMPLES)
        assert np.isfinite(float(metadata["train_loss"])) and float(metadata["seconds_per_sample"]) > 0

        assert any(s.state == "training" and s.round == 1 for s in fleet.statuses())
        wait_until(lambda: fleet.statuses()[-1].state == "online")
        assert fleet.statuses()[-1].profile.seconds_per_sample > 0
        stop.set()
        thread.join(15)
    offline = messages.decode(retained(fleet.topics.status(fleet.device_id)), DeviceStatus)
    assert offline.state == "offline"
    assert len(coordinator.uploads) == 1  # the retained task re-delivered by the broker is not redone


def test_task_withdrawn_before_upload_is_not_uploaded(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    coordinator = fleet.coordinator
    coordinator.download_delay_s = 2.0
    with running_daemon(fleet):
        fleet.send_task(make_task("task-1", blob=coordinator.blob))
        wait_until(lambda: coordinator.downloads)
        # the round closed with other devices' results: the coordinator withdraws the task, signed
        fleet.send_task(messages.encode(TaskWithdrawal(["task-1"])))
        wait_until(lambda: warnings_about(caplog, "withdrew it"))
        assert coordinator.acks == ["task-1"]
        assert coordinator.uploads == []
        wait_until(lambda: fleet.statuses()[-1].state == "online")

        coordinator.download_delay_s = 0.0
        fleet.send_task(make_task("task-2", blob=coordinator.blob))
        wait_until(lambda: coordinator.uploads)  # the next round's task is done as usual
        assert [u.task_id for u in coordinator.uploads] == ["task-2"]


def test_a_task_whose_acknowledgement_is_refused_is_dropped(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator = fleet.coordinator
    coordinator.over.add("stale")  # its round closed before the device took it
    with running_daemon(fleet):
        fleet.send_task(make_task("stale", blob=coordinator.blob))
        wait_until(
            lambda: warnings_about(caplog, "dropping task stale of round 1: the coordinator withdrew it")
        )
        fleet.send_task(make_task("fresh", blob=coordinator.blob))
        wait_until(lambda: coordinator.uploads)
    assert coordinator.acks == ["fresh"] and [u.task_id for u in coordinator.uploads] == ["fresh"]


def test_a_deeper_model_in_a_task_is_built_and_trained(fleet: Fleet) -> None:
    from fedspeech.models import build_model, depth_of
    from fedspeech.models.growth import grow
    from fedspeech.models.train import get_arrays

    shallow = ModelSpec("transformer", 8000, 8000, 11, depth=1)
    deep = ModelSpec("transformer", 8000, 8000, 11, depth=2)
    coordinator = fleet.coordinator
    coordinator.blob = weights.encode(get_arrays(build_model(shallow)))
    with running_daemon(fleet):
        for number, spec in enumerate((shallow, deep), start=1):
            if spec is deep:  # the coordinator grew the model between rounds
                coordinator.blob = weights.encode(grow(weights.decode(coordinator.blob)[0], deep, seed=1))
            fleet.send_task(replace(make_task(f"task-{number}", blob=coordinator.blob), spec=spec))
            wait_until(lambda n=number: len(coordinator.uploads) == n)
            assert depth_of(weights.decode(coordinator.uploads[-1].body)[0]) == spec.depth


def test_keeps_the_latest_global_model_as_onnx(fleet: Fleet, tmp_path, caplog) -> None:
    models = tmp_path / "models"
    kept = models / "model.onnx"
    fleet.announce(3, b"onnx of round 3")  # retained before the device starts
    with running_daemon(fleet, model_dir=models):
        wait_until(lambda: kept.exists())
        assert kept.read_bytes() == b"onnx of round 3"
        fleet.announce(4, b"onnx of round 4", sha256="0" * 64)  # corrupted on the way
        wait_until(lambda: warnings_about(caplog, "not keeping the model of round 4"))
        assert kept.read_bytes() == b"onnx of round 3", "a bad download never replaces the kept model"
        fleet.announce(5, b"onnx of round 5")
        wait_until(lambda: kept.read_bytes() == b"onnx of round 5")
    assert json.loads((models / "model.json").read_text())["round"] == 5


def test_malformed_tasks_are_logged_and_dropped(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fedspeech.edge_client")
    wrong_type = json.loads(messages.encode(make_task("bad", blob=fleet.coordinator.blob)))
    wrong_type["epochs"] = "one"
    with running_daemon(fleet) as (_, thread):
        fleet.publish_task(b"not json")
        wait_until(lambda: warnings_about(caplog, "not a signed message: not JSON"))
        # signed by the coordinator's key, yet not a task
        fleet.send_task(b"not json")
        wait_until(lambda: warnings_about(caplog, "not JSON: "))
        fleet.send_task(b"[" * 60_000)
        wait_until(lambda: warnings_about(caplog, "nested too deeply"))
        fleet.send_task(json.dumps(wrong_type).encode())
        wait_until(lambda: warnings_about(caplog, "epochs"))
        assert thread.is_alive()
        fleet.send_task(make_task("good", blob=fleet.coordinator.blob))
        wait_until(lambda: fleet.coordinator.uploads)
    assert [u.task_id for u in fleet.coordinator.uploads] == ["good"]


def test_wrong_digest_is_dropped(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fedspeech.edge_client")
    with running_daemon(fleet):
        fleet.send_task(make_task(blob=fleet.coordinator.blob, sha256="0" * 64))
        wait_until(lambda: warnings_about(caplog, "sha256 mismatch"))
        wait_until(lambda: fleet.statuses()[-1].state == "online")
    assert fleet.coordinator.downloads == [BLOB_PATH]
    assert fleet.coordinator.uploads == []


def test_expired_task_is_ignored(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fedspeech.edge_client")
    with running_daemon(fleet):
        fleet.send_task(make_task(blob=fleet.coordinator.blob, deadline_in=-5))
        wait_until(lambda: any("deadline has passed" in r.getMessage() for r in list(caplog.records)))
    assert fleet.coordinator.downloads == []
    assert fleet.coordinator.uploads == []


def test_refused_token_registers_again_and_retries(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    fleet.coordinator.reject_tokens = 1
    with running_daemon(fleet):
        fleet.send_task(make_task(blob=fleet.coordinator.blob))
        wait_until(lambda: fleet.coordinator.uploads)
    assert len(fleet.coordinator.registrations) == 2
    assert warnings_about(caplog, "the coordinator refused our token")
    # the second registration offered the token the first one issued
    assert fleet.coordinator.authorizations[1] is not None


@contextmanager
def private_broker(port: int) -> Iterator[None]:
    """A Mosquitto of our own that the test may stop and start (without persistence: it forgets retained)."""
    process = subprocess.Popen(["mosquitto", "-p", str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: listening(port), timeout=5)
        yield
    finally:
        process.terminate()
        process.wait(5)


@pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs the mosquitto binary")
def test_reconnects_and_takes_tasks_after_broker_restart(fleet: Fleet) -> None:
    port = free_port()
    config = fleet.config(broker=BrokerSettings(f"mqtt://127.0.0.1:{port}"))
    status_topic, task_topic = fleet.topics.status(fleet.device_id), fleet.topics.task(fleet.device_id)

    def state() -> str | None:
        payload = retained(status_topic, port, timeout=0.5)
        return messages.decode(payload, DeviceStatus).state if payload else None

    stop = threading.Event()
    thread = threading.Thread(target=run_client, args=(config, stop), daemon=True)
    try:
        with private_broker(port):
            thread.start()
            wait_until(state)
        with private_broker(port):
            wait_until(lambda: state() == "online")  # re-published after the automatic reconnect
            publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
            publisher.connect("127.0.0.1", port)
            publisher.loop_start()
            body = messages.encode(make_task(blob=fleet.coordinator.blob))
            task = signing.sign(fleet.coordinator.key, task_topic, body)
            publisher.publish(task_topic, task, qos=1, retain=True).wait_for_publish(5)
            publisher.disconnect()
            publisher.loop_stop()
            wait_until(lambda: fleet.coordinator.uploads)
            stop.set()
            thread.join(15)
            assert state() == "offline"
    finally:
        stop.set()
        thread.join(15)


def test_sigterm_goes_offline_and_exits_zero(fleet: Fleet, processes) -> None:
    process = processes.start("client", *client_args(fleet))
    wait_until(lambda: any(s.state == "online" for s in fleet.statuses()))
    process.terminate()
    assert process.wait(15) == 0
    status = messages.decode(retained(fleet.topics.status(fleet.device_id)), DeviceStatus)
    assert status.state == "offline"


def test_evaluation_task_reports_counts_of_the_test_split(fleet: Fleet) -> None:
    coordinator = fleet.coordinator
    with running_daemon(fleet):
        fleet.send_task(evaluation(make_task("eval-1", blob=coordinator.blob)))
        wait_until(lambda: coordinator.uploads)
    upload = coordinator.uploads[0]
    assert upload.path == "/api/rounds/1/evaluations" and upload.headers["Content-Type"] == "application/json"
    report = messages.decode(upload.body, EvaluationReport)
    confusion = np.array(report.confusion)
    # FSDD's own split: takes 0-4 of each digit are the speaker's 50 test clips, 5 per digit
    assert confusion.shape == (11, 11) and confusion.sum(axis=1).tolist() == [5] * 10 + [0], "no _none_ tests"
    assert report.loss_sum > 0 and report.task_id == "eval-1"
    assert b"jackson" not in upload.body and b".flac" not in upload.body


def test_a_training_setting_the_device_does_not_know_is_refused(fleet: Fleet, caplog) -> None:
    coordinator = fleet.coordinator
    with running_daemon(fleet):
        fleet.send_task(replace(make_task("unknown", blob=coordinator.blob), config={"momentum_boost": 2.0}))
        wait_until(lambda: warnings_about(caplog, "unknown training setting 'momentum_boost'"))
        fleet.send_task(replace(make_task("negative", blob=coordinator.blob), config={"proximal_mu": -1.0}))
        wait_until(lambda: warnings_about(caplog, "proximal_mu = -1.0 is outside"))
        fleet.send_task(replace(make_task("fedprox", blob=coordinator.blob), config={"proximal_mu": 0.01}))
        wait_until(lambda: coordinator.uploads)
    assert [u.task_id for u in coordinator.uploads] == ["fedprox"]


def test_paths_outside_the_api_are_refused(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    evil = make_task("evil", blob=fleet.coordinator.blob)
    with running_daemon(fleet):
        for number, path in enumerate(
            (":18081/api/models/0/weights", "@evil.example/api/x", "/api/../../etc")
        ):
            # even signed by the coordinator's key, a task naming such a path is not one
            fleet.send_task(replace(evil, task_id=f"evil-{number}", weights=replace(evil.weights, path=path)))
            wait_until(lambda p=path: warnings_about(caplog, f"not the path of a round's weights: {p!r}"))
    assert fleet.coordinator.downloads == [] and fleet.coordinator.uploads == []


def test_a_data_folder_is_scanned_again_at_each_task(fleet: Fleet, tmp_path, caplog) -> None:
    folder = tmp_path / "data"
    copy_takes(folder, "012", range(20), SPEAKER)
    (folder / "3").mkdir()
    (folder / "3" / "empty.wav").write_bytes(b"")
    coordinator = fleet.coordinator
    with running_daemon(fleet, data=DataSource(folder=folder), max_samples=None):
        wait_until(lambda: warnings_about(caplog, "empty.wav: empty file"))
        first = fleet.statuses()[-1]
        assert set(first.train_counts) | set(first.test_counts) == {"0", "1", "2"}
        assert sum(first.train_counts.values()) + sum(first.test_counts.values()) == 60
        fleet.send_task(make_task("task-1", blob=coordinator.blob))
        wait_until(lambda: coordinator.uploads)
        trained_on = int(weights.decode(coordinator.uploads[0].body)[1]["num_samples"])
        assert trained_on == sum(first.train_counts.values())

        copy_takes(folder, "7", range(20), SPEAKER)  # recorded while the daemon runs
        fleet.send_task(make_task("task-2", blob=coordinator.blob))
        wait_until(lambda: len(coordinator.uploads) == 2)
        now = fleet.statuses()[-1]
        assert now.train_counts["7"] + now.test_counts.get("7", 0) == 20
        assert int(weights.decode(coordinator.uploads[1].body)[1]["num_samples"]) == sum(
            now.train_counts.values()
        )
        # new clips, registered again before the task: the coordinator counts no more than registered
        assert [(r.num_samples, r.test_counts) for r in coordinator.registrations] == [
            (sum(first.train_counts.values()), first.test_counts),
            (sum(now.train_counts.values()), now.test_counts),
        ]
        # the split is a function of each file's path: old files kept their side
        assert {k: now.test_counts.get(k, 0) for k in "012"} == {
            k: first.test_counts.get(k, 0) for k in "012"
        }
    assert len(warnings_about(caplog, "empty.wav")) == 1, "a bad file is reported once, not at every task"
