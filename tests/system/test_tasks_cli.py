"""The coordinator given a bad task file: one line naming the key, and no state left behind."""

import subprocess
import sys

from tests.helpers.task_files import GOOD


def test_coordinator_with_a_bad_task_file_stops_with_one_line(tmp_path):
    path = tmp_path / "task.toml"
    path.write_text(GOOD.replace("16000", "1"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedspeech",
            "coordinator",
            "--task",
            str(path),
            "--state",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"fedspeech coordinator: {path}: key sample_rate: must be between 4000 and 48000 Hz, got 1"
    )
    missing = subprocess.run(
        [sys.executable, "-m", "fedspeech", "coordinator", "--task", "nothing.toml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert "no such task file, nor a built-in task" in missing.stderr and "Traceback" not in missing.stderr
    assert not (tmp_path / "fedspeech-state").exists(), "a bad task leaves no state behind"
