"""Mutual distillation's server data: labelled or unlabelled clips, and the server model trained on them."""

import shutil

import numpy as np
import pytest

from fedspeech.coordinator.app import create_app
from fedspeech.models.clips.datasets import client_clips, load_corpus
from tests.helpers.configs import coordinator_config


def _app(tmp_path, server):
    return create_app(coordinator_config(tmp_path, strategy="mkd", server_data=server))


@pytest.fixture(scope="module")
def clips():
    return client_clips(load_corpus("fsdd"), "theo")[0][:6]


def test_unlabelled_server_clips_train_the_server_model_by_distillation_alone(tmp_path, clips):
    for clip in clips:  # files straight in the folder: no labels
        shutil.copyfile(clip.path, tmp_path / clip.path.name)
    model = _app(tmp_path, tmp_path).extensions["fedspeech"].orchestrator.model
    waveforms, labels = model.server_data
    assert waveforms.shape == (6, 8000) and labels is None
    teacher, student = model.initial(1), model.initial(2)
    settings = {"epochs": 1, "batch_size": 4, "learning_rate": 1e-2, "temperature": 2.0, "seed": 0}
    trained = model.distil(student, teacher, **settings)
    assert trained.keys() == student.keys()
    assert any(not np.array_equal(trained[name], student[name]) for name in student), "the student learned"
    assert all(np.array_equal(teacher[name], model.initial(1)[name]) for name in teacher), (
        "the teacher did not"
    )


def test_labelled_server_clips_keep_their_labels(tmp_path, clips):
    corpus = load_corpus("fsdd")
    for clip in clips:
        (tmp_path / corpus.labels[clip.label]).mkdir(exist_ok=True)
        shutil.copyfile(clip.path, tmp_path / corpus.labels[clip.label] / clip.path.name)
    waveforms, labels = _app(tmp_path, tmp_path).extensions["fedspeech"].orchestrator.model.server_data
    assert labels is not None and sorted(labels.tolist()) == sorted(c.label for c in clips)


def test_a_server_folder_without_usable_clips_stops_the_coordinator(tmp_path):
    (tmp_path / "notes.txt").write_text("not audio")
    with pytest.raises(ValueError, match="no usable clips for unlabelled server data"):
        _app(tmp_path, tmp_path)
