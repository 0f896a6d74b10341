"""A new fleet's first model from its words alone: `fedspeech coordinator --init synthetic` speaks the task
file's words with the machine's synthesizers and trains round 0 on them before any device is online;
three real device processes over Mosquitto, each with a small folder of real speech (one with synthetic
takes of its own mixed in), evaluate it and train from it, and a restart neither speaks nor trains again.
"""

import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from fedspeech.models.clips.datasets import load_corpus
from tests.helpers.ports import free_port
from tests.helpers.shared_data import SHARED_DATA
from tests.helpers.waiting import get_json, wait_for

WORDS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
TAKES_PER_WORD = 4  # on each device: a household's first recordings


def _folders(root: Path) -> dict[str, Path]:
    """Three devices' folders of real speech, each of its own speakers, a few takes of each word."""
    corpus = load_corpus("speech_commands", SHARED_DATA)
    by_speaker: dict[str, list] = defaultdict(list)
    for clip in corpus.clips:
        by_speaker[clip.speaker].append(clip)
    folders = {}
    for i, device in enumerate(["kitchen", "hallway", "garage"]):
        taken: dict[str, int] = defaultdict(int)
        for speaker in sorted(by_speaker)[i::3]:
            for clip in by_speaker[speaker]:
                word = corpus.labels[clip.label]
                if word in WORDS and taken[word] < TAKES_PER_WORD:
                    taken[word] += 1
                    (root / device / word).mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(clip.path, root / device / word / clip.path.name)
        folders[device] = root / device
    return folders


@pytest.mark.skipif(not shutil.which("espeak-ng"), reason="needs espeak-ng: apt-get install espeak-ng")
@pytest.mark.skipif(not (SHARED_DATA / "speech_commands_test").is_dir(), reason="needs ../shared/data")
@pytest.mark.timeout(600)
def test_a_fleet_starts_from_synthetic_speech_of_its_task_files_words(
    tmp_path, mosquitto_url, topic_root, processes
):
    task_file = tmp_path / "commands.toml"
    task_file.write_text(
        f'name = "commands"\nlabels = {WORDS!r}\nsample_rate = 16000\nclip_seconds = 1.0\n'.replace("'", '"')
    )
    state, port = tmp_path / "state", free_port()
    url = f"http://127.0.0.1:{port}"
    common = ["--broker", mosquitto_url, "--topic-root", topic_root]
    coordinator = [
        "coordinator", "--task", str(task_file), "--state", str(state), "--new-state", "--port", str(port),
        "--open-enrolment", "--init", "synthetic", "--init-takes", "24", "--init-epochs", "3",
        "--rounds", "2", "--min-devices", "3", "--min-results", "3", "--epochs", "1", *common,
    ]  # fmt: skip
    first = processes.start("coordinator", *coordinator)
    wait_for(lambda: get_json(f"{url}/api/status") is not None, 300, "the first model, then the API")
    log = first.log_path.read_text()
    assert "speaking the task's words with" in log and "the first model is trained" in log, log[-3000:]
    assert "about" in log and "s left" in log, "progress with the time left"
    (synthetic,) = (state / "synthetic").iterdir()
    assert sorted(p.name for p in synthetic.iterdir()) == sorted([*WORDS, "SOURCE.md"])
    assert all(len(list((synthetic / w).glob("*.flac"))) >= 20 for w in WORDS)

    clients = []
    for device, folder in _folders(tmp_path / "devices").items():
        args = ["--data", str(folder), "--device-id", device, "--coordinator", url, *common]
        # one device trains on synthetic takes of its own beside its recordings
        mixed = ["--mix-synthetic", "5"] if device == "garage" else []
        clients.append(
            processes.start(f"device-{device}", "client", *args, *mixed, "--state", str(tmp_path / "ds"))
        )

    def finished() -> bool:
        assert all(p.poll() is None for p in clients), "a device process died"
        status = get_json(f"{url}/api/status")
        return bool(status and status["finished"])

    wait_for(finished, 400, "two rounds", interval=1.0)
    rounds = get_json(f"{url}/api/rounds")
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds:  # evaluated on the devices from round 0 on, the trained first model among them
        assert r["evaluation_reports"] == 3 and 0.0 <= r["federated_accuracy"] <= 1.0, r
    print("federated accuracy by round:", [r["federated_accuracy"] for r in rounds])
    assert rounds[0]["federated_accuracy"] > 0.2, "synthetic speech alone beats chance (0.1) on real voices"
    (spoken,) = (tmp_path / "ds" / "garage" / "synthetic").iterdir()
    assert all(len(list((spoken / w).glob("*.flac"))) == 5 for w in WORDS)
    assert not (tmp_path / "ds" / "kitchen" / "synthetic").exists()
    devices = {d["device_id"]: d for d in get_json(f"{url}/api/devices")}
    garage = devices["garage"]
    counted = {w: garage["train_counts"].get(w, 0) + garage["test_counts"].get(w, 0) for w in WORDS}
    assert counted == dict.fromkeys(WORDS, TAKES_PER_WORD), "only its own clips are counted"
    assert garage["num_samples"] == sum(garage["train_counts"].values()), "registered: its own clips"

    # a restart with the same state resumes: nothing spoken or trained again
    first.terminate()
    first.wait(timeout=60)
    again = processes.start("coordinator-again", *coordinator)
    wait_for(lambda: get_json(f"{url}/api/status") is not None, 120, "the coordinator again")
    relog = again.log_path.read_text()
    assert "speaking" not in relog and "training the first model" not in relog, relog[-2000:]
