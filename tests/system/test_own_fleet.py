"""A fleet on its own recordings: a task file, device data folders, and a coordinator that holds no speech."""

import json
import shutil
import sqlite3
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedspeech.models.clips.datasets import load_corpus
from fedspeech.models.clips.tasks import SPEECH_COMMANDS_LABELS
from fedspeech_bench.attacks.mosquitto import running_mosquitto
from tests.helpers.ports import free_port
from tests.helpers.waiting import get_json, wait_for

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ROUNDS = 4
# each device holds some of the labels, all of them together every label
DEVICE_LABELS = {
    "kitchen": ["yes", "no", "up", "down", "left", "right", "_silence_", "_unknown_"],
    "hallway": ["on", "off", "stop", "go", "yes", "no", "_silence_"],
    "garage": ["up", "down", "left", "right", "on", "off", "stop", "go", "_unknown_"],
}
CLIPS_PER_LABEL = 30


def _build_folders(root: Path) -> dict[str, Path]:
    """One data folder per device, from disjoint speakers of the Speech Commands test set."""
    corpus = load_corpus("speech_commands", SHARED_DATA)
    by_speaker: dict[str, list] = defaultdict(list)
    for clip in corpus.clips:
        by_speaker[clip.speaker].append(clip)
    speakers = sorted(by_speaker)
    folders = {}
    for i, (device, labels) in enumerate(DEVICE_LABELS.items()):
        folder = root / device
        taken: dict[str, int] = defaultdict(int)
        for speaker in speakers[i::3]:  # every third speaker: no voice is on two devices
            for clip in by_speaker[speaker]:
                label = corpus.labels[clip.label]
                if label in labels and taken[label] < CLIPS_PER_LABEL:
                    taken[label] += 1
                    (folder / label).mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(clip.path, folder / label / clip.path.name)
        folders[device] = folder
    # what a user's folder also holds: a corrupt recording and a folder that is not a label
    (folders["kitchen"] / "yes" / "broken.flac").write_bytes(b"fLaC\x00 not really audio" * 10)
    (folders["kitchen"] / "notes").mkdir()
    (folders["kitchen"] / "notes" / "todo.wav").write_bytes(b"RIFF")
    return folders


@pytest.fixture
def readme_broker(tmp_path, topic_root) -> Iterator[tuple[dict[str, Path], str]]:
    """As the README sets it up: devices enrolled, `fedspeech broker-config`, Mosquitto with its files.

    Yields each device's secret file and the broker's URL.
    """
    secrets = {}
    for i, device in enumerate(DEVICE_LABELS):  # enrolled as the README does: a secret file per device
        secrets[device] = tmp_path / f"{device}.secret"
        new_state = ["--new-state"] if i == 0 else []  # the first one makes the coordinator's state
        state = ["--state", str(tmp_path / "state"), *new_state]
        added = fedspeech("devices", "add", device, *state, "--secret-file", str(secrets[device]))
        assert f"coordinator's state {tmp_path / 'state'};" in added.stderr, added.stderr
        assert secrets[device].stat().st_mode & 0o777 == 0o600
    port = free_port()
    fedspeech(
        "broker-config", "--state", str(tmp_path / "state"), "--port", str(port), "--topic-root", topic_root
    )
    with running_mosquitto(tmp_path / "state" / "broker" / "mosquitto.conf", port):
        yield secrets, f"mqtt://127.0.0.1:{port}"


def fedspeech(*args: str, **options) -> subprocess.CompletedProcess:
    """Run `python -m fedspeech ARGS` to the end; its output captured unless stdout is given."""
    options = {"stdout": subprocess.PIPE} | options
    return subprocess.run(
        [sys.executable, "-m", "fedspeech", *args], stderr=subprocess.PIPE, text=True, check=True, **options
    )


@pytest.mark.skipif(not (SHARED_DATA / "speech_commands_test").is_dir(), reason="needs ../shared/data")
@pytest.mark.timeout(600)
def test_devices_train_and_evaluate_on_their_own_folders(tmp_path, readme_broker, topic_root, processes):
    secrets, broker_url = readme_broker
    folders = _build_folders(tmp_path / "devices")
    task_file = tmp_path / "commands.toml"
    task_file.write_text(
        'name = "commands"\n'
        f"labels = {json.dumps(SPEECH_COMMANDS_LABELS)}\n"
        "sample_rate = 16000\nclip_seconds = 1.0\n"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state = tmp_path / "state"
    common = ["--broker", broker_url, "--topic-root", topic_root]
    processes.start(
        "coordinator", "coordinator", "--task", str(task_file), "--state", str(state), "--port", str(port),
        "--rounds", str(ROUNDS), "--min-devices", "3", "--min-results", "3", "--epochs", "3", *common,
    )  # fmt: skip
    clients = {}
    for device, folder in folders.items():
        args = ["--data", str(folder), "--device-id", device, "--coordinator", url, *common]
        args += ["--state", str(tmp_path / "device-state"), "--enrolment-secret-file", str(secrets[device])]
        clients[device] = processes.start(f"device-{device}", "client", *args)

    def finished():
        assert all(p.poll() is None for p in clients.values()), "a device process died"
        status = get_json(f"{url}/api/status")
        return status and status["finished"]

    wait_for(finished, 540, f"{ROUNDS} rounds", interval=1.0)

    rounds = get_json(f"{url}/api/rounds")[1:]
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    for r in rounds:  # no central set: the devices' counts are the only scores, every round
        assert r["accuracy"] is None
        assert r["evaluation_asked"] == 3 and r["evaluation_reports"] == 3
        assert 0.0 <= r["federated_accuracy"] <= 1.0 and r["federated_loss"] > 0
    accuracies = [r["federated_accuracy"] for r in rounds]
    print("federated accuracy by round:", accuracies)
    assert accuracies[-1] > accuracies[0] + 0.05, accuracies
    detail = get_json(f"{url}/api/rounds/{ROUNDS}")
    per_device = {e["device_id"]: e for e in detail["evaluations"]}
    assert set(per_device) == set(folders)
    assert sum(e["clips"] for e in per_device.values()) > 0

    # the device log names what it skipped and why; the other devices skipped nothing
    kitchen = clients["kitchen"].log_path.read_text()
    assert f"skipping {folders['kitchen'] / 'yes' / 'broken.flac'}: unreadable or corrupt audio" in kitchen
    assert f"skipping {folders['kitchen'] / 'notes'}: folder 'notes' is not a label of the task" in kitchen
    assert "skipping" not in clients["garage"].log_path.read_text()

    # counts per label reach the coordinator, file names never do
    devices = {d["device_id"]: d for d in get_json(f"{url}/api/devices")}
    assert set(devices["hallway"]["train_counts"]) <= set(DEVICE_LABELS["hallway"])
    kitchen_counts = devices["kitchen"]["train_counts"].values(), devices["kitchen"]["test_counts"].values()
    usable = [p for p in folders["kitchen"].rglob("*.flac") if p.name != "broken.flac"]
    assert sum(map(sum, kitchen_counts)) == len(usable)
    names = {p.name for folder in folders.values() for p in folder.rglob("*")} | {"broken", "notes"}
    names = {n for n in names if n not in SPEECH_COMMANDS_LABELS}
    paths = ["/api/status", "/api/devices", "/api/rounds", *(f"/api/rounds/{r}" for r in range(ROUNDS + 1))]
    seen_by_coordinator = " ".join(json.dumps(get_json(f"{url}{path}")) for path in paths)
    with sqlite3.connect(state / "state.sqlite3") as db:
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            seen_by_coordinator += json.dumps(db.execute(f"SELECT * FROM {table}").fetchall())
    leaked = sorted(n for n in names if n in seen_by_coordinator)
    assert not leaked, leaked
    kept = [path.read_text().strip() for path in secrets.values()]
    assert not [s for s in kept if s in seen_by_coordinator], "the coordinator keeps only hashes of secrets"
    assert str(tmp_path / "devices") not in seen_by_coordinator

    # a listener on kitchen logs in with the password kitchen's daemon was issued, and runs the last model
    clip = next(p for p in (folders["kitchen"] / "yes").iterdir() if p.name != "broken.flac")
    device_state = str(tmp_path / "device-state")
    listen = ["--device-id", "kitchen", "--state", device_state, "--input", str(clip)]
    heard = fedspeech("listen", "--coordinator", url, *common, *listen, timeout=120)
    assert "logging in to the broker as kitchen-listen" in heard.stderr, heard.stderr
    assert "downloaded" in heard.stderr and "connected to broker" in heard.stderr, heard.stderr
