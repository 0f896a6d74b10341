"""Faults over real processes: nothing lost or counted twice when a coordinator, broker, device or disk fails.

A coordinator killed while it aggregates, the broker down for 20 s, a device killed halfway through its
upload, and the state directory's disk full for real (a small tmpfs).
"""

import errno
import hashlib
import os
import queue
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedspeech.protocol import weights
from fedspeech.protocol.messages import Task
from fedspeech.protocol.topics import Topics
from fedspeech_bench.attacks.mosquitto import listening
from tests.helpers.devices import Processes, ScriptedDevice, start_clients, unchanged_update, upload
from tests.helpers.ports import free_port
from tests.helpers.waiting import get_json, wait_for

SAMPLES = 40


def coordinator_args(
    state: Path, broker_url: str, port: int, topic_root: str, *round_settings: str
) -> list[str]:
    """A coordinator under open enrolment whose devices train only (no evaluation tasks)."""
    return [
        "coordinator",
        "--state", str(state), "--new-state",
        "--broker", broker_url,
        "--port", str(port),
        "--topic-root", topic_root,
        "--open-enrolment",
        "--eval-every", "0",
        *round_settings,
    ]  # fmt: skip


def start_coordinator(processes: Processes, name: str, args: list[str], url: str):
    """Start a coordinator and wait until it serves HTTP."""
    proc = processes.start(name, *args)
    wait_for(lambda: get_json(f"{url}/api/status") or proc.poll() is not None, 90, f"{name} to serve")
    assert proc.poll() is None, proc.log_path.read_text()[-3000:]
    return proc


def status(url: str) -> dict:
    """The coordinator's /api/status, {} if it does not answer."""
    return get_json(f"{url}/api/status") or {}


def answer(url: str, device: ScriptedDevice, task: Task) -> bytes:
    """Send the task's model back untouched, which must be accepted; return the body sent."""
    body = unchanged_update(url, task, SAMPLES)
    assert upload(url, task.upload_path, device.token, body) == 200, (
        f"{device.device_id}'s update of round {task.round}"
    )
    return body


def online_device(device_id: str, broker_url: str, topic_root: str, url: str) -> ScriptedDevice:
    """A scripted device, registered and online."""
    device = ScriptedDevice(device_id, broker_url, Topics(topic_root))
    device.register(url, SAMPLES)
    device.go_online(SAMPLES)
    return device


def check_model_files(url: str, state: Path, rounds: list[dict]) -> None:
    """Each round's files served and stored match its record; no other model file is left behind."""
    kinds = ("weights", "onnx", "frontend", "classifier")  # the one ONNX file and its two graphs
    for record in rounds:
        for kind in kinds:
            digest = record[f"{kind}_sha256"]
            with urllib.request.urlopen(f"{url}/api/models/{record['round']}/{kind}", timeout=10) as reply:
                assert hashlib.sha256(reply.read()).hexdigest() == digest, f"round {record['round']} {kind}"
    suffixes = ("safetensors", "onnx", "frontend.onnx", "classifier.onnx")
    expected = {f"round-{r['round']:05d}.{suffix}" for r in rounds for suffix in suffixes}
    files = {p.name for p in (state / "models").iterdir()}
    assert {name for name in files if not name.startswith(".")} == expected
    if files != expected:  # a temporary file of write_atomically whose process was killed mid-write
        print("left behind in models/:", sorted(files - expected))


def log_lines(proc, text: str) -> list[str]:
    """The lines of a process' log that contain text."""
    return [line for line in proc.log_path.read_text().splitlines() if text in line]


# -- 1. the coordinator killed while it aggregates -----------------------------------------------------


@pytest.mark.timeout(900)
def test_a_coordinator_killed_while_it_aggregates_loses_and_doubles_no_round(
    tmp_path, mosquitto_url, topic_root, processes
):
    rounds, killed_round = 3, 2
    port = free_port()
    url, state = f"http://127.0.0.1:{port}", tmp_path / "state"
    args = coordinator_args(
        state, mosquitto_url, port, topic_root,
        "--rounds", str(rounds), "--min-devices", "2", "--min-results", "2", "--round-timeout", "300",
    )  # fmt: skip
    first = start_coordinator(processes, "coordinator-1", args, url)
    (george,) = start_clients(processes, ["george"], url, mosquitto_url, topic_root, SAMPLES)
    # The second device is the test's: its update is the last of round 2, and the coordinator dies with it.
    held = online_device("held", mosquitto_url, topic_root, url)
    try:
        answer(url, held, held.next_task(300))
        task = held.next_task(300)
        assert task.round == killed_round
        accepted = f"round {killed_round}: update from george accepted"
        wait_for(lambda: log_lines(first, accepted), 300, "george's update of round 2")
        before = get_json(f"{url}/api/rounds")
        assert [r["round"] for r in before] == [0, 1]
        body = unchanged_update(url, task, SAMPLES)
        assert upload(url, task.upload_path, held.token, body) == 200
        first.send_signal(signal.SIGKILL)  # aggregation, evaluation, export and storing are under way
        killed_at = time.time()
        first.wait(timeout=10)

        second = start_coordinator(processes, "coordinator-2", args, url)
        while not status(url).get("finished"):
            try:
                topic, payload = held.tasks.get(timeout=1)
            except queue.Empty:
                assert second.poll() is None, second.log_path.read_text()[-3000:]
                continue
            answer(url, held, held.take(topic, payload))
    finally:
        held.close()

    after = get_json(f"{url}/api/rounds")
    assert [r["round"] for r in after] == list(range(rounds + 1)), "every round exactly once"
    assert after[:killed_round] == before, "rounds completed before the kill are kept as they were"
    assert all(r["results"] == 2 for r in after[1:])
    (resumed,) = log_lines(second, "resuming after round")
    stored_before_kill = resumed.endswith(f"resuming after round {killed_round}")
    killed = get_json(f"{url}/api/rounds/{killed_round}")
    held_update = next(u for u in killed["updates"] if u["device_id"] == "held")
    assert [u["device_id"] for u in killed["updates"]] == ["george", "held"]
    if stored_before_kill:  # stored before the kill took the process: it stands as it was
        assert killed["started_at"] < killed_at
        assert held_update["sha256"] == weights.sha256(body)
    else:  # run again from scratch, with new tasks
        assert resumed.endswith(f"resuming after round {killed_round - 1}"), resumed
        assert killed["started_at"] > killed_at
        assert held_update["sha256"] != weights.sha256(body), "the update sent before the kill is not reused"
    print(f"round {killed_round} was {'stored before' if stored_before_kill else 'run again after'} the kill")
    check_model_files(url, state, after)
    assert george.poll() is None, "the device carried on"


# -- 2. the broker down for 20 s --------------------------------------------------------------------------


class OwnBroker:
    """A Mosquitto of the test's own, default settings (no persistence), that can be stopped and restarted."""

    def __init__(self, log: Path) -> None:
        self.port, self.log = free_port(), log
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """Its mqtt:// URL."""
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it on its port and wait until it listens."""
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(["mosquitto", "-p", str(self.port)], stdout=out, stderr=out)
        wait_for(lambda: listening(self.port), 20, "Mosquitto to listen")

    def stop(self) -> None:
        """SIGTERM it and wait for it to exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


@pytest.fixture
def own_broker(tmp_path) -> Iterator[OwnBroker]:
    broker = OwnBroker(tmp_path / "mosquitto.log")
    broker.start()
    yield broker
    broker.stop()


@pytest.mark.timeout(900)
def test_a_broker_down_for_20_s_mid_run_loses_no_round(tmp_path, own_broker, topic_root, processes):
    rounds = 3
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = coordinator_args(
        tmp_path / "state", own_broker.url, port, topic_root,
        "--rounds", str(rounds), "--min-devices", "2", "--min-results", "2", "--round-timeout", "300",
    )  # fmt: skip
    coordinator = start_coordinator(processes, "coordinator", args, url)
    clients = start_clients(processes, ["george", "lucas"], url, own_broker.url, topic_root, SAMPLES)
    wait_for(lambda: (status(url).get("completed_round") or 0) >= 1, 300, "round 1")

    # Mosquitto publishes the devices' last wills as it stops: the coordinator sees them offline, and an
    # open round short of its results is run again (printed below).
    own_broker.stop()
    stopped_with = status(url)["completed_round"]
    time.sleep(20)  # the outage itself
    assert not listening(own_broker.port)
    own_broker.start()
    restarted = time.monotonic()
    completed_at_restart = status(url)["completed_round"]
    wait_for(lambda: status(url).get("completed_round", 0) > completed_at_restart, 300, "a round after")
    took = time.monotonic() - restarted
    print(
        f"broker stopped after round {stopped_with}; round {completed_at_restart} was complete when it "
        f"came back; round {completed_at_restart + 1} completed {took:.1f} s after its restart"
    )
    wait_for(lambda: status(url).get("finished"), 300, "all rounds")
    print("rounds run again:", *log_lines(coordinator, "round is run again") or ["none"], sep="\n  ")

    listed = get_json(f"{url}/api/rounds")
    assert [r["round"] for r in listed] == list(range(rounds + 1)), "every round exactly once"
    assert all(r["results"] == 2 for r in listed[1:])
    assert all(p.poll() is None for p in [coordinator, *clients]), "no process exited"
    for proc in [coordinator, *clients]:  # each saw the broker go and reconnected to the new one
        assert len(log_lines(proc, f"connected to broker {own_broker.url}")) >= 2, proc.log_path.name


# -- 3. a device killed halfway through its upload ----------------------------------------------------


def half_upload(port: int, device: ScriptedDevice, task: Task, body: bytes) -> None:
    """Send the upload's headers and half its body, then close the socket, as a device killed mid-upload."""
    head = (
        f"POST {task.upload_path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {device.token}\r\nX-Content-SHA256: {weights.sha256(body)}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + body[: len(body) // 2])


@pytest.mark.timeout(600)
def test_an_upload_cut_halfway_is_never_accepted(tmp_path, mosquitto_url, topic_root, processes):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = coordinator_args(
        tmp_path / "state", mosquitto_url, port, topic_root,
        "--rounds", "2", "--min-devices", "2", "--min-results", "1", "--round-timeout", "20",
    )  # fmt: skip
    coordinator = start_coordinator(processes, "coordinator", args, url)
    torn = online_device("torn", mosquitto_url, topic_root, url)
    whole = online_device("whole", mosquitto_url, topic_root, url)
    try:
        torn_task, whole_task = torn.next_task(120), whole.next_task(120)
        assert torn_task.round == whole_task.round == 1
        half_upload(port, torn, torn_task, unchanged_update(url, torn_task, SAMPLES))
        cut = "'/api/rounds/1/updates' from 127.0.0.1: the client went away"
        wait_for(lambda: log_lines(coordinator, cut), 60, "the cut upload's end")
        assert status(url)["open_round"] == 1, "the round goes on"
        sent = answer(url, whole, whole_task)
        # torn never answers: the round closes at its deadline with the update it has
        wait_for(lambda: status(url).get("completed_round") == 1, 120, "round 1")
        first = get_json(f"{url}/api/rounds/1")
        assert [u["device_id"] for u in first["updates"]] == ["whole"]
        assert first["results"] == 1 and first["devices"] == 2
        assert first["bytes_up"] == len(sent), "only the accepted body counts as traffic"
        assert not log_lines(coordinator, "update from torn accepted")

        # The coordinator keeps serving, and the device, started again, is taken as before.
        torn_task, whole_task = torn.next_task(120), whole.next_task(120)
        assert torn_task.round == whole_task.round == 2
        sent_both = len(answer(url, torn, torn_task)) + len(answer(url, whole, whole_task))
        wait_for(lambda: status(url).get("finished"), 120, "round 2")
    finally:
        torn.close()
        whole.close()
    second = get_json(f"{url}/api/rounds/2")
    assert [u["device_id"] for u in second["updates"]] == ["torn", "whole"]
    assert second["bytes_up"] == sent_both
    print("the cut upload was logged as:", *log_lines(coordinator, cut))


# -- 4. the state directory's disk full, for real ----------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path, processes) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test; the test's processes are stopped before it is unmounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (test_orchestrator.py covers a full disk in the store)")
    mount = tmp_path / "state"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs: {result.stderr.strip()} (test_orchestrator.py covers a full disk)"
        )
    try:
        yield mount
    finally:
        processes.stop_all()
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(path: Path) -> None:
    """Write zeros to path until the disk has no room left, not even for a small write."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


@pytest.mark.timeout(600)
def test_a_full_state_disk_fails_the_save_and_the_round_runs_once_there_is_room(
    small_disk, mosquitto_url, topic_root, processes
):
    state, port = small_disk, free_port()
    url = f"http://127.0.0.1:{port}"
    args = coordinator_args(
        state, mosquitto_url, port, topic_root,
        "--rounds", "2", "--min-devices", "1", "--min-results", "1", "--round-timeout", "120",
    )  # fmt: skip
    coordinator = start_coordinator(processes, "coordinator", args, url)
    device = online_device("kitchen", mosquitto_url, topic_root, url)
    try:
        answer(url, device, device.next_task(120))
        wait_for(lambda: status(url).get("completed_round") == 1, 120, "round 1")
        kept = get_json(f"{url}/api/rounds")
        filler = state / "filler"
        fill(filler)
        print(f"filled the state disk with {filler.stat().st_size} bytes")

        task = device.next_task(120)
        assert task.round == 2
        answer(url, device, task)
        failed = "could not store round 2"
        wait_for(lambda: log_lines(coordinator, failed), 120, "the save of round 2 to fail")
        (line,) = log_lines(coordinator, failed)
        print("the failed save was logged as:", line)
        assert " ERROR " in line and "No space left on device" in line
        assert "Traceback" not in coordinator.log_path.read_text()
        assert get_json(f"{url}/api/rounds") == kept, "the earlier rounds are listed as they were"
        with sqlite3.connect(f"file:{state / 'state.sqlite3'}?mode=ro", uri=True) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert coordinator.poll() is None

        filler.unlink()
        again = device.next_task(120)
        assert again.round == 2 and again.task_id != task.task_id, "round 2 is run again"
        answer(url, device, again)
        wait_for(lambda: status(url).get("finished"), 120, "round 2")
    finally:
        device.close()
    listed = get_json(f"{url}/api/rounds")
    assert [r["round"] for r in listed] == [0, 1, 2] and listed[:2] == kept
    assert len(log_lines(coordinator, failed)) == 1, "one line for the one failed save"
    check_model_files(url, state, listed)
