"""A new fleet's first model (--init): trained on synthetic speech with real espeak-ng and the product's
training step, cached by what it depends on; or read from a file and checked against the task's model.
"""

import logging
import shutil

import numpy as np
import pytest

from fedspeech.coordinator.model.pretraining import InitError, Pretraining, balanced, start_weights
from fedspeech.models import build_model
from fedspeech.models.clips.tasks import spec_for, task_from_mapping
from fedspeech.models.train import get_arrays
from fedspeech.protocol import weights

pytestmark = [
    pytest.mark.skipif(not shutil.which("espeak-ng"), reason="needs espeak-ng: apt-get install espeak-ng"),
    pytest.mark.timeout(300),
]

TASK = task_from_mapping({"name": "home", "labels": ["stop", "go"], "sample_rate": 8000, "clip_seconds": 1.0})
SPEC = spec_for(TASK)
QUICK = Pretraining(takes=4, epochs=1)


def fresh() -> dict[str, np.ndarray]:
    return get_arrays(build_model(SPEC))


def test_the_synthetic_start_is_trained_once_and_then_read_from_the_cache(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    first = start_weights("synthetic", TASK, SPEC, fresh(), tmp_path, settings=QUICK)
    assert first is not None
    weights.check_like(first, fresh())
    assert not all(np.array_equal(first[n], a) for n, a in fresh().items()), "trained, not fresh"
    (folder,) = (tmp_path / "synthetic").iterdir()
    assert (folder / "SOURCE.md").is_file() and len(list((folder / "stop").glob("*.flac"))) == 4
    assert "the first model is trained" in caplog.text
    caplog.clear()
    again = start_weights("synthetic", TASK, SPEC, fresh(), tmp_path, settings=QUICK)
    assert again is not None and all(np.array_equal(again[n], first[n]) for n in first)
    assert "trained before" in caplog.text and "speaking" not in caplog.text


def test_a_folder_of_speech_trains_it_too_and_a_new_recording_there_trains_it_again(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    extra = tmp_path / "corpus"
    start_weights("synthetic", TASK, SPEC, fresh(), tmp_path / "made", settings=QUICK)  # some real speech:
    shutil.copytree(next((tmp_path / "made" / "synthetic").iterdir()), extra)  # the synthetic takes
    start_weights("random", TASK, SPEC, fresh(), tmp_path / "state", extra, QUICK)
    assert "training the first model on 8 clips" in caplog.text
    shutil.copy(next((extra / "go").iterdir()), extra / "go" / "another.flac")
    caplog.clear()
    start_weights("random", TASK, SPEC, fresh(), tmp_path / "state", extra, QUICK)
    assert "training the first model on 9 clips" in caplog.text


def test_random_is_none_and_a_file_must_hold_the_tasks_model(tmp_path):
    assert start_weights("random", TASK, SPEC, fresh(), tmp_path) is None
    good = tmp_path / "good.safetensors"
    model = fresh()
    good.write_bytes(weights.encode(model))
    read = start_weights(str(good), TASK, SPEC, fresh(), tmp_path)
    assert read is not None and all(np.array_equal(read[n], model[n]) for n in model)
    other = get_arrays(build_model(spec_for(task_from_mapping({**_three()}))))  # three classes, not two
    bad = tmp_path / "other.safetensors"
    bad.write_bytes(weights.encode(other))
    with pytest.raises(InitError, match="not weights of this task's model"):
        start_weights(str(bad), TASK, SPEC, fresh(), tmp_path)
    with pytest.raises(InitError, match="cannot read it"):
        start_weights(str(tmp_path / "missing.safetensors"), TASK, SPEC, fresh(), tmp_path)
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 100)
    with pytest.raises(InitError, match="not weights"):
        start_weights(str(tmp_path / "junk.safetensors"), TASK, SPEC, fresh(), tmp_path)


def _three() -> dict:
    return {"name": "home", "labels": ["stop", "go", "up"], "sample_rate": 8000, "clip_seconds": 1.0}


def test_an_epoch_takes_as_much_other_speech_as_the_commonest_word_drawn_anew():
    labelled = ["a", "b", "_unknown_", "_silence_"]
    task = task_from_mapping({"name": "t", "labels": labelled, "sample_rate": 8000, "clip_seconds": 1.0})
    labels = np.array([0] * 5 + [1] * 7 + [2] * 40 + [3] * 3)
    rng = np.random.default_rng(0)
    first, second = balanced(labels, task, rng), balanced(labels, task, rng)
    for chosen in (first, second):
        assert len(set(chosen)) == len(chosen)
        assert np.bincount(labels[chosen]).tolist() == [5, 7, 7, 3]  # words and noise whole, 7 others
    assert set(first) != set(second)


def test_an_epoch_of_a_task_without_other_speech_is_every_clip():
    labels = np.array([0, 1, 1, 0, 1])
    assert balanced(labels, TASK, np.random.default_rng(0)).tolist() == [0, 1, 2, 3, 4]
