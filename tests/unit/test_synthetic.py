"""Synthetic speech for a task: every word label spoken by the machine's voices into a data folder that
training reads like a device's own, with real espeak-ng (and flite and festival where installed).
"""

import hashlib
import shutil

import numpy as np
import pytest
import soundfile

from fedspeech.models.clips.datasets import load_audio
from fedspeech.models.clips.folders import list_folder
from fedspeech.models.clips.synthesizers import espeak_voices, festival_voices, flite_voices
from fedspeech.models.clips.synthetic import SynthesisRefused, spoken_text, synthesize
from fedspeech.models.clips.tasks import BUILTIN_TASKS, TaskFileError, task_from_mapping

pytestmark = [
    pytest.mark.skipif(not shutil.which("espeak-ng"), reason="needs espeak-ng: apt-get install espeak-ng"),
    pytest.mark.timeout(300),
]

WORDS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]  # the README's task
COMMANDS = task_from_mapping({"name": "commands", "labels": WORDS, "sample_rate": 16000, "clip_seconds": 1.0})


def test_espeak_ng_alone_gives_at_least_50_distinct_takes_of_every_word_that_training_can_read(tmp_path):
    summary = synthesize(COMMANDS, tmp_path, takes=60, voices=espeak_voices())
    clips, skipped = list_folder(tmp_path, WORDS)
    assert not skipped
    for n, word in enumerate(WORDS):
        files = sorted((tmp_path / word).glob("*.flac"))
        assert len(files) == summary.takes[word] >= 50, word
        digests = {hashlib.sha256(soundfile.read(f, dtype="int16")[0].tobytes()).digest() for f in files}
        assert len(digests) == len(files), f"{word}: takes that are the same"
        assert sum(clip.label == n for clip in clips) == len(files)
    audio, rate = soundfile.read(files[0])
    assert rate == 16000 and len(audio) <= 16000 and 10 ** (-20.5 / 20) < np.abs(audio).max() < 0.9
    assert load_audio(files[0], 16000, 16000).shape == (16000,)
    source = (tmp_path / "SOURCE.md").read_text()
    assert "espeak-ng" in source and '`stop`: "stop"' in source and "en-us" in source


def test_a_task_says_how_a_label_is_spoken_and_labels_like_this_are_never_spoken(tmp_path):
    document = {
        "name": "home", "labels": ["lights_on", "stop", "_unknown_", "_silence_"], "sample_rate": 8000,
        "clip_seconds": 1.5, "say": {"stop": "halt"},
    }  # fmt: skip
    task = task_from_mapping(document)
    assert spoken_text(task, "stop") == "halt" and spoken_text(task, "lights_on") == "lights on"
    summary = synthesize(task, tmp_path, takes=5, voices=espeak_voices()[:5])
    assert sorted(summary.takes) == ["_unknown_", "lights_on", "stop"]  # other speech: _unknown_
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SOURCE.md", "_unknown_", "lights_on", "stop"]
    assert soundfile.info(next((tmp_path / "stop").glob("*.flac"))).samplerate == 8000
    assert '`stop`: "halt"' in (tmp_path / "SOURCE.md").read_text()


@pytest.mark.parametrize(
    ("say", "problem"),
    [
        ({"nope": "no"}, "not a word label"),
        ({"_unknown_": "other"}, "not a word label"),
        ({"stop": "-v en --stdout"}, "must be words"),
        ({"stop": "stop; rm -rf ~"}, "must be words"),
        ({"stop": "a" * 101}, "at most 100"),
        ({"stop": 3}, "a table of label"),
    ],
)
def test_a_say_that_is_not_words_of_a_label_is_refused_in_one_line(say, problem):
    document = {"name": "t", "labels": ["stop", "_unknown_"], "sample_rate": 16000, "clip_seconds": 1.0}
    with pytest.raises(TaskFileError, match=problem):
        task_from_mapping({**document, "say": say})


def test_an_emotion_task_is_refused_and_so_is_a_machine_without_synthesizers(tmp_path, monkeypatch):
    with pytest.raises(SynthesisRefused, match="emotions"):
        synthesize(BUILTIN_TASKS["emodb"], tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no synthesizer on it
    with pytest.raises(SynthesisRefused, match="no speech synthesizer found"):
        synthesize(COMMANDS, tmp_path / "out")


@pytest.mark.skipif(not (shutil.which("flite") and shutil.which("festival")), reason="needs flite, festival")
def test_flite_and_festival_voices_add_takes_when_installed(tmp_path):
    voices = flite_voices() + festival_voices()
    assert {v.synthesizer for v in voices} == {"flite", "festival"}
    summary = synthesize(COMMANDS, tmp_path, takes=len(voices), voices=voices)
    names = {p.name.split("-")[0] for p in (tmp_path / "stop").glob("*.flac")}
    assert names == {"flite", "festival"} and summary.takes["stop"] == len(voices)


def test_a_task_with_a_none_class_gets_other_speech_in_it_as_many_takes_as_its_words_together(tmp_path):
    task = BUILTIN_TASKS["fsdd"]  # the digits and _none_
    summary = synthesize(task, tmp_path, takes=6, voices=espeak_voices())
    assert summary.takes["_none_"] >= 0.9 * 6 * 10 and all(summary.takes[d] >= 5 for d in "0123456789")
    clips, skipped = list_folder(tmp_path, task.labels)
    others = [c for c in clips if task.labels[c.label] == "_none_"]
    assert not skipped and len(others) == summary.takes["_none_"]
    for clip in others:  # cut to a clip where two or three words in a row are longer
        info = soundfile.info(clip.path)
        assert info.samplerate == 8000 and info.frames <= 8000
    assert "`_none_`: other speech" in (tmp_path / "SOURCE.md").read_text()
    assert not any((tmp_path / label).exists() for label in ("_silence_", "_unknown_"))


def test_a_task_of_words_alone_gets_no_other_speech(tmp_path):
    summary = synthesize(COMMANDS, tmp_path, takes=2, voices=espeak_voices()[:2])
    assert sorted(summary.takes) == sorted(WORDS)  # no none class to put it in
