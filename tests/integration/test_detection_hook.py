"""The command run on each detection (runtime.detection_hook), as real processes: what a detection holds
reaches it in its environment verbatim and runs nothing else; runs are one at a time, in order, and a
full queue drops detections; a run past its timeout is killed with its children, a failing one is logged,
and either way the next detection runs the command again; its output costs no memory; and a listener
hearing FSDD digits runs it once per digit.
"""

import json
import logging
import os
import shlex
import stat
import subprocess
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import psutil
import pytest
import soundfile

from fedspeech.runtime.detection_hook import DEFAULT_QUEUE_SIZE, STDERR_BYTES, DetectionHook
from fedspeech.runtime.listener import Listener
from fedspeech.runtime.session import OnnxModel
from fedspeech.runtime.streaming import Detection
from tests.helpers.onnx_files import with_metadata
from tests.helpers.recordings import held_out_digits
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.timeout(120)


# a hook: appends a JSON line at its start and one at its end (after sleeping argv[2] seconds) to the file
# argv[1], with its arguments and its FEDSPEECH_ variables
RECORDER = r"""
import json, os, sys, time
def note(event):
    values = {k: v for k, v in os.environ.items() if k.startswith("FEDSPEECH_")}
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps({"event": event, "time": time.time(), "argv": sys.argv[1:], **values}) + "\n")
note("start")
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
note("end")
"""


def recorder(out: Path, sleep_s: float = 0.0) -> list[str]:
    """The recording hook's command, writing to out."""
    return [sys.executable, "-c", RECORDER, str(out)] + ([str(sleep_s)] if sleep_s else [])


def events(out: Path) -> list[dict]:
    """What the recording hook wrote, in order."""
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def ends(out: Path) -> list[dict]:
    """The recording hook's finished runs, in order."""
    return [event for event in events(out) if event["event"] == "end"]


def script(path: Path, text: str) -> Path:
    """An executable sh script."""
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def hook_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The hook's log messages."""
    return [r.getMessage() for r in caplog.records if r.name == "fedspeech.runtime.detection_hook"]


def gone(pid: int) -> bool:
    """Whether the process pid has ended (a zombie waiting for its reaper has)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---- what reaches the command ----

LABEL = "x; touch PWNED"
SPOKEN = "$(touch PWNED2) `touch PWNED3` && rm -rf ~/canary | cat > PWNED4; touch PWNED5 & 'touch PWNED6'\""


@pytest.mark.parametrize("kind", ["python", "sh"])
def test_shell_metacharacters_reach_the_hook_verbatim_and_run_nothing(tmp_path, monkeypatch, kind):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (home / "canary").write_text("still here")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))  # `~` in the spoken form, were it ever run, is this folder
    out = tmp_path / "out"
    if kind == "python":
        command = recorder(out)
    else:  # a shell script that quotes its variables, as a hook should
        printf = 'printf \'%s\\n\' "$#" "$FEDSPEECH_LABEL" "$FEDSPEECH_SPOKEN" > "$1"\n'
        command = [str(script(tmp_path / "hook.sh", printf)), str(out)]
    hook = DetectionHook(command, spoken=lambda label: SPOKEN if label == LABEL else "?")
    hook(Detection(LABEL, 0.93, 1.25, 7))
    hook.close(finish_queued=True)

    if kind == "python":
        [run] = ends(out)
        assert (run["FEDSPEECH_LABEL"], run["FEDSPEECH_SPOKEN"]) == (LABEL, SPOKEN)
        assert run["argv"] == [str(out)]  # the detection is not on its command line
    else:
        assert out.read_text().splitlines() == ["1", LABEL, SPOKEN]
    assert hook.runs == 1 and hook.failures == hook.timeouts == 0
    for folder in (tmp_path, work, Path.cwd(), home):
        assert not list(folder.rglob("PWNED*")), folder
    assert (home / "canary").read_text() == "still here"


def test_the_detection_arrives_in_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSPEECH_INHERITED", "from the listener's environment")
    out = tmp_path / "out"
    spoken = {"7": "seven", "8": "a\0b\ud800c" + "z" * 5000}  # a model's metadata may hold anything
    hook = DetectionHook(recorder(out), spoken=spoken.__getitem__)
    before = datetime.now(UTC)
    hook(Detection("7", 0.875, 12.34, 3))
    hook(Detection("8", 0.5, 0.0, None))
    hook.close(finish_queued=True)
    after = datetime.now(UTC)

    seven, eight = ends(out)
    assert {k: v for k, v in seven.items() if k.startswith("FEDSPEECH_") and k != "FEDSPEECH_WALL_TIME"} == {
        "FEDSPEECH_LABEL": "7",
        "FEDSPEECH_SPOKEN": "seven",
        "FEDSPEECH_CONFIDENCE": "0.8750",
        "FEDSPEECH_TIME": "12.340",
        "FEDSPEECH_ROUND": "3",
        "FEDSPEECH_INHERITED": "from the listener's environment",
    }
    wall = datetime.fromisoformat(seven["FEDSPEECH_WALL_TIME"])
    assert wall.utcoffset() is not None and before.replace(microsecond=0) <= wall <= after
    assert eight["FEDSPEECH_ROUND"] == ""  # a model exported outside the rounds
    # no NUL, a lone surrogate replaced, cut at 1000 characters: the command still starts
    assert eight["FEDSPEECH_SPOKEN"] == "ab?c" + "z" * 996
    assert hook.runs == 2 and hook.failures == 0


# ---- one at a time, a bounded queue ----


def test_runs_never_overlap_and_a_full_queue_drops_detections(tmp_path, caplog):
    out = tmp_path / "out"
    hook = DetectionHook(recorder(out, sleep_s=0.3))
    assert hook._queue.maxsize == DEFAULT_QUEUE_SIZE == 8
    detections = [Detection(f"word{i}", 0.9, i * 0.1, 1) for i in range(15)]
    assert hook.submit(detections[0])
    wait_for(lambda: events(out), 10, "the first run to start", interval=0.01)  # the queue is empty again
    queued = [hook.submit(detection) for detection in detections[1:]]  # far quicker than a run
    assert queued == [True] * 8 + [False] * 6
    assert hook.dropped == 6
    hook.close(finish_queued=True)

    seen = events(out)
    assert [e["event"] for e in seen] == ["start", "end"] * 9  # each run ended before the next started
    assert [e["FEDSPEECH_LABEL"] for e in seen[::2]] == [f"word{i}" for i in range(9)]  # in order
    assert all(a["time"] <= b["time"] for a, b in zip(seen, seen[1:], strict=False))
    drops = [m for m in hook_messages(caplog) if "dropped" in m]
    assert len(drops) == 6 and "'word14'" in drops[-1] and "6 dropped so far" in drops[-1]


def test_close_drops_what_is_queued_and_waits_for_the_running_command(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    out = tmp_path / "out"
    hook = DetectionHook(recorder(out, sleep_s=0.5))
    for i in range(4):
        hook(Detection(f"word{i}", 0.9, i, 1))
    wait_for(lambda: events(out), 10, "the first run to start", interval=0.01)
    hook.close()
    assert [e["event"] for e in events(out)] == ["start", "end"]  # the running one finished, no other ran
    assert any("3 queued detection(s) not run" in m for m in hook_messages(caplog))
    assert not hook._thread.is_alive()
    assert not hook.submit(Detection("late", 0.9, 9.0, 1))


# ---- timeouts and failures ----


def test_a_hook_past_its_timeout_is_killed_with_its_child_and_the_next_runs(tmp_path, caplog):
    runs, child = tmp_path / "runs", tmp_path / "child.pid"
    hang = script(
        tmp_path / "hook.sh",
        'echo "start $FEDSPEECH_LABEL" >> "$1"\n'
        'if [ "$FEDSPEECH_LABEL" = hang ]; then\n'
        "    echo stuck >&2\n"
        "    sleep 60 &\n"
        '    echo $! > "$2"\n'
        "    wait\n"
        "fi\n"
        'echo "end $FEDSPEECH_LABEL" >> "$1"\n',
    )
    hook = DetectionHook([str(hang), str(runs), str(child)], timeout_s=1.0)
    started = time.monotonic()
    hook(Detection("hang", 0.9, 1.0, 1))
    hook(Detection("next", 0.9, 2.0, 1))
    hook.close(finish_queued=True)

    assert time.monotonic() - started < 5
    assert runs.read_text().splitlines() == ["start hang", "start next", "end next"]
    assert hook.timeouts == 1 and hook.runs == 2 and hook.failures == 0
    wait_for(lambda: gone(int(child.read_text())), 5, "the hook's sleep to be killed", interval=0.05)
    [killed] = [m for m in hook_messages(caplog) if "killed after" in m]
    assert "'hang'" in killed and "timeout 1.0 s" in killed and "stuck" in killed


def test_a_failing_hook_is_logged_and_the_next_detection_runs_it(tmp_path, caplog):
    runs = tmp_path / "runs"
    failing = script(
        tmp_path / "hook.sh",
        'echo "$FEDSPEECH_LABEL" >> "$1"\n'
        'if [ "$FEDSPEECH_LABEL" = bad ]; then echo "oops: the lamp is unplugged" >&2; exit 3; fi\n',
    )
    hook = DetectionHook([str(failing), str(runs)])
    hook(Detection("bad", 0.9, 1.0, 1))
    hook(Detection("good", 0.9, 2.0, 1))
    hook.close(finish_queued=True)
    assert runs.read_text().splitlines() == ["bad", "good"]
    assert hook.runs == 2 and hook.failures == 1
    [failure] = [m for m in hook_messages(caplog) if "status" in m]
    assert "'bad'" in failure and "exited with status 3" in failure
    assert "oops: the lamp is unplugged" in failure

    # the command no longer executable, then again: logged, and listening goes on
    hook = DetectionHook([str(failing), str(runs)])
    failing.chmod(0o644)
    hook(Detection("unrunnable", 0.9, 3.0, 1))
    wait_for(lambda: hook.failures, 10, "the run to fail", interval=0.01)
    failing.chmod(0o755)
    hook(Detection("again", 0.9, 4.0, 1))
    hook.close(finish_queued=True)
    assert runs.read_text().splitlines() == ["bad", "good", "again"]
    assert any("could not start" in m and "'unrunnable'" in m for m in hook_messages(caplog))


@pytest.mark.parametrize("case", ["not on PATH", "no file", "not executable", "a folder", "empty"])
def test_a_command_that_cannot_run_is_refused_at_construction(tmp_path, case):
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\n")
    command = {
        "not on PATH": ["fedspeech-no-such-command", "--flag"],
        "no file": [str(tmp_path / "missing.sh")],
        "not executable": [str(plain)],
        "a folder": [str(tmp_path)],
        "empty": [],
    }[case]
    with pytest.raises(ValueError, match="the detection hook's command") as error:
        DetectionHook(command)
    assert "\n" not in str(error.value)


# ---- output ----


def test_megabytes_of_output_are_read_in_bounded_memory(tmp_path, caplog):
    loud = "import sys\nfor out in sys.stdout, sys.stderr:\n    out.buffer.write(b'x' * 2**25)\nsys.exit(1)\n"
    hook = DetectionHook([sys.executable, "-c", loud], timeout_s=30)
    tracemalloc.start()
    try:
        hook(Detection("loud", 0.9, 1.0, 1))
        hook.close(finish_queued=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert hook.runs == 1 and hook.failures == 1 and hook.timeouts == 0  # ran to its end, 32 MB each
    assert peak < 2**21, f"{peak} bytes allocated at the peak"
    [failure] = [m for m in hook_messages(caplog) if "status 1" in m]
    assert "x" * STDERR_BYTES in failure and "x" * (STDERR_BYTES + 1) not in failure


def test_a_process_left_in_the_background_does_not_hold_the_hook(tmp_path):
    child = tmp_path / "child.pid"
    background = script(tmp_path / "hook.sh", 'sleep 30 &\necho $! > "$1"\n')
    hook = DetectionHook([str(background), str(child)], timeout_s=10)
    started = time.monotonic()
    try:
        hook(Detection("bell", 0.9, 1.0, 1))
        hook.close(finish_queued=True)
        assert time.monotonic() - started < 3  # done when the script exits, its sleep holding its stderr
        assert hook.runs == 1 and hook.failures == hook.timeouts == 0
        assert not gone(int(child.read_text()))  # left alone
    finally:
        if child.exists():
            os.kill(int(child.read_text()), 9)


# ---- through a listener ----


def take(digits: list[str], speaker: str, number: int, pause_s: float = 0.6) -> np.ndarray:
    """A speaker's held-out recordings (FSDD's 0-4) of these digits, pause_s apart and around."""
    return held_out_digits(digits, speaker, number, pause_s)[0]


TAKES = [(["3", "8", "1"], "lucas", 1), (["6", "2"], "george", 3)]


@pytest.mark.parametrize("digits, speaker, number", TAKES)
def test_a_listener_runs_the_hook_once_per_detected_digit(fsdd_model, tmp_path, digits, speaker, number):
    out = tmp_path / "out"
    listener: Listener | None = None

    def spoken(label: str) -> str:
        assert listener is not None
        return listener.model.spoken(label)

    hook = DetectionHook(recorder(out), spoken=spoken)
    listener = Listener(fsdd_model.onnx_path, on_detection=hook)
    audio = take(digits, speaker, number)
    detections: list[Detection] = []
    for start in range(0, len(audio), 1234):  # blocks of any size
        detections += listener.feed(audio[start : start + 1234])
    detections += listener.flush()
    hook.close(finish_queued=True)

    assert [d.label for d in detections] == digits
    runs = ends(out)
    assert [run["FEDSPEECH_LABEL"] for run in runs] == digits
    for run, detection in zip(runs, detections, strict=True):
        assert run["FEDSPEECH_SPOKEN"] == listener.model.spoken(detection.label)
        assert run["FEDSPEECH_TIME"] == f"{detection.time_s:.3f}"
        assert run["FEDSPEECH_CONFIDENCE"] == f"{detection.confidence:.4f}"
        assert run["FEDSPEECH_ROUND"] == "1"
    assert hook.runs == len(digits) and hook.dropped == hook.failures == 0


def test_a_model_file_whose_labels_and_spoken_forms_hold_shell_code_runs_the_hook_alone(fsdd_model, tmp_path):
    # a model a user drops in carries its labels and spoken forms in its metadata, unchecked by any task
    # file: `fedspeech listen --model M --input F --on-detect CMD` hears "3" and "8" under hostile names
    work = tmp_path / "work"
    work.mkdir()
    labels = json.loads(OnnxModel(fsdd_model.onnx_path).metadata["labels"])
    hostile = {"3": "3; touch PWNED1", "8": "$(touch PWNED2)`touch PWNED3`"}
    say = {hostile["3"]: "three' && touch PWNED4 #", hostile["8"]: "eight | touch PWNED5"}
    model = with_metadata(
        fsdd_model.onnx_path, tmp_path / "hostile.onnx", [hostile.get(label, label) for label in labels],
        say=json.dumps(say),
    )  # fmt: skip
    wav = tmp_path / "digits.wav"
    soundfile.write(wav, take(["3", "8"], "lucas", 1), 8000)
    out = tmp_path / "out"
    hook = f"{shlex.quote(sys.executable)} -c {shlex.quote(RECORDER)} {shlex.quote(str(out))}"
    listen = [sys.executable, "-m", "fedspeech", "listen", "--model", str(model), "--input", str(wav)]
    run = subprocess.run(listen + ["--on-detect", hook], cwd=work, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    runs = ends(out)
    assert [(r["FEDSPEECH_LABEL"], r["FEDSPEECH_SPOKEN"]) for r in runs] == [
        (hostile["3"], say[hostile["3"]]),
        (hostile["8"], say[hostile["8"]]),
    ]
    assert all(r["argv"] == [str(out)] for r in runs)
    for folder in (tmp_path, work, Path.cwd()):
        assert not list(folder.rglob("PWNED*")), folder
