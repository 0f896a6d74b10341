"""`fedspeech eval MODEL DIR`: a model's accuracy and confusion matrix on a folder of one's own clips."""

import re
import subprocess
import sys

import numpy as np

from fedspeech.models.clips.datasets import load_audio
from fedspeech.runtime.session import OnnxModel
from tests.helpers.recordings import copy_takes


def fedspeech(*args: str) -> subprocess.CompletedProcess:
    """Run `python -m fedspeech ARGS` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "fedspeech", *args], capture_output=True, text=True, timeout=120
    )


def test_eval_scores_a_folder_and_names_what_it_skips(fsdd_model, tmp_path):
    folder = copy_takes(tmp_path / "clips", "0123456789", range(5), speaker="george")  # held out: takes 0-4
    (folder / "7" / "broken.wav").write_bytes(b"RIFF not audio")
    (folder / "seven").mkdir()  # a label the model does not have
    result = fedspeech("eval", str(fsdd_model.onnx_path), str(folder))
    assert result.returncode == 0, result.stderr
    model = OnnxModel(fsdd_model.onnx_path)
    clips = sorted(folder.glob("[0-9]/*.flac"))
    truth = [model.labels.index(path.parent.name) for path in clips]
    heard = model.predict(np.stack([load_audio(p, model.sample_rate, model.num_samples) for p in clips]))
    right = int(np.sum(heard.argmax(axis=1) == truth))
    first = result.stdout.splitlines()[0]
    assert first == f"50 clips in {folder}: accuracy {right / 50:.4f} ({right} right)", result.stdout
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[2:] if line[:1] == " "}
    assert set(rows) >= set("0123456789") and all(sum(map(int, rows[d][:-1])) == 5 for d in "0123456789")
    assert "broken.wav" in result.stderr and "seven" in result.stderr, result.stderr
    assert re.search(r"no clips of: .*none", result.stdout), result.stdout


def test_eval_refuses_in_one_line_what_it_cannot_score(fsdd_model, tmp_path):
    not_a_model = tmp_path / "model.onnx"
    not_a_model.write_bytes(b"not a model")
    empty = tmp_path / "clips"
    empty.mkdir()
    for args, said in [
        ((str(not_a_model), str(empty)), "not a usable fedspeech ONNX model"),
        ((str(fsdd_model.onnx_path), str(tmp_path / "nowhere")), "no such folder"),
        ((str(fsdd_model.onnx_path), str(empty)), "no usable clips in"),
    ]:
        result = fedspeech("eval", *args)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("fedspeech eval: ") and said in line, line
