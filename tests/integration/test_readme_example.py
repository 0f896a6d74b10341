"""The README's library example, run as written, prints the words of a held-out recording."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile

from tests.helpers.recordings import held_out_digits

ROOT = Path(__file__).resolve().parents[2]
SPOKEN = ["4", "0", "8", "2", "5"]

pytestmark = pytest.mark.timeout(120)


def library_example() -> str:
    """The first python block of the README's "The listener as a library" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### The listener as a library") :]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_readme_library_example_prints_the_words_of_a_recording(fsdd_model, tmp_path):
    code = library_example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 10, "ten lines at most"
    demo = tmp_path / "fedspeech-demo"
    demo.mkdir()
    (demo / "model.onnx").write_bytes(fsdd_model.onnx_path.read_bytes())
    audio, _ = held_out_digits(SPOKEN, "george", 1)
    soundfile.write(demo / "digits.wav", audio, 8000, subtype="PCM_16")
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    words = [line.split()[2] for line in run.stdout.splitlines()]
    assert words == SPOKEN, run.stdout
