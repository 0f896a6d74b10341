"""Ctrl-C (SIGINT to the process) ends every long command without a traceback, wherever it is: starting,
speaking a first model's words, serving, waiting for its coordinator, listening, running the demo."""

import contextlib
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tests.helpers.ports import free_port
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.timeout(300)

# a command, and a line of its log that says it is under way: SIGINT is sent once it shows
CASES = {
    "coordinator speaking its first model's words": (
        [
            "coordinator",
            "--state",
            "{tmp}/state",
            "--port",
            "0",
            "--init",
            "synthetic",
            "--init-takes",
            "300",
        ],
        "speaking the task's words",
    ),
    "coordinator serving": (["coordinator", "--state", "{tmp}/state", "--port", "0"], "dashboard at"),
    "synthesize": (["synthesize", "--task", "fsdd", "--out", "{tmp}/spoken", "--takes", "600"], "takes: "),
    "client waiting for its coordinator": (
        [
            "client",
            "--speaker",
            "theo",
            "--coordinator",
            "http://127.0.0.1:{port}",
            "--state",
            "{tmp}/device",
        ],
        "failed (connection refused)",
    ),
    "listen": (["listen", "--model", "{model}", "--input", "{tmp}/long.wav", "--realtime"], "threshold"),
    "demo": (["demo", "--out", "{tmp}/demo", "--full-speed", "--rounds", "3"], "coordinator on"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ctrl_c_ends_a_long_command_without_a_traceback(case, tmp_path, processes, fsdd_model, mosquitto_url):
    args, under_way = CASES[case]
    if ("synthetic" in args or case == "synthesize") and not shutil.which("espeak-ng"):
        pytest.skip("needs espeak-ng: apt-get install espeak-ng")
    hiss = np.random.default_rng(0).normal(0, 0.01, 8000 * 120).astype(np.float32)  # two minutes
    soundfile.write(tmp_path / "long.wav", hiss, 8000)
    places = {"tmp": str(tmp_path), "port": str(free_port()), "model": str(fsdd_model.onnx_path)}
    argv = [arg.format(**places) for arg in args]
    if argv[0] == "coordinator":
        topic_root = f"fedspeech-test/interrupts-{places['port']}"
        argv += ["--new-state", "--broker", mosquitto_url, "--topic-root", topic_root]
    proc = processes.start(case.replace(" ", "-"), *argv)
    wait_for(lambda: under_way in proc.log_path.read_text() or proc.poll() is not None, 240, under_way)
    assert proc.poll() is None, proc.log_path.read_text()[-3000:]
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        signals = [line for line in _status(proc.pid) if line.startswith(("SigBlk", "SigIgn", "SigCgt"))]
        pytest.fail(f"still running 60 s after Ctrl-C ({signals}): {proc.log_path.read_text()[-3000:]}")
    log = proc.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert code in (0, 130), (code, log[-3000:])


def test_a_terminated_demo_stops_its_devices(tmp_path, processes):
    out = tmp_path / "demo"
    proc = processes.start("demo", "demo", "--out", str(out), "--full-speed", "--rounds", "3")
    wait_for(lambda: "devices: " in proc.log_path.read_text() or proc.poll() is not None, 240, "the devices")
    assert proc.poll() is None, proc.log_path.read_text()[-3000:]
    assert _started_from(out / "devices"), "the demo's devices run"
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running 60 s after SIGTERM: {proc.log_path.read_text()[-3000:]}")
    assert code == 130 and "Traceback" not in proc.log_path.read_text()
    assert not _started_from(out / "devices"), "no device of the demo is left running"


def _started_from(folder: Path) -> list[int]:
    """The processes whose command line names the folder."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(folder).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
    return found


def _status(pid: int) -> list[str]:
    """The lines of /proc/PID/status (its signal masks among them); none once it is gone."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/status").read_text().splitlines()
    return []
