"""Building the fedspeech wheel from a copy of the source tree; running commands, their output kept."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


CLIP = "1_lucas_1.flac"  # a held-out take (FSDD's recordings 0-4 are its test split): "1"


DETECTION = re.compile(r"^\s*(\d+\.\d+) s  (\S+)  (\d\.\d\d)$", re.MULTILINE)  # `listen` output


def run(command: list, cwd: Path, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command to the end; fail the test with its output if it fails or hangs."""
    command = [str(part) for part in command]
    try:
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"timed out after {timeout} s: {' '.join(command)}\n{output(exc.stdout, exc.stderr)}")
    if result.returncode != 0:
        pytest.fail(f"exit {result.returncode}: {' '.join(command)}\n{output(result.stdout, result.stderr)}")
    return result


def output(stdout: str | bytes | None, stderr: str | bytes | None, limit: int = 8000) -> str:
    """The end of a command's stdout and stderr, for a failure message."""

    def tail(text: str | bytes | None) -> str:
        text = text.decode(errors="replace") if isinstance(text, bytes) else text or ""
        return text[-limit:]

    return f"--- stdout ---\n{tail(stdout)}\n--- stderr ---\n{tail(stderr)}"


def build_wheel(work: Path) -> Path:
    """`python -m build --wheel` on a copy of the source tree in work (the build writes build/, egg-info)."""
    source = work / "source"
    junk = [".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache", ".venv"]
    junk += ["fedspeech-demo", "fedspeech-state"]  # the demo's output, where someone ran it in the checkout
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*junk))
    run([sys.executable, "-m", "build", "--wheel", "--outdir", work / "dist", source], work, 600)
    (path,) = (work / "dist").glob("fedspeech-0*.whl")
    return path
