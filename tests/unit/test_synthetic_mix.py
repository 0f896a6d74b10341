"""`fedspeech client --mix-synthetic N`: a device's own clips trained on with N takes of each word spoken by
its own synthesizers (real espeak-ng), spoken once a task, never counted as its own or tested on.
"""

import logging
import shutil

import numpy as np
import pytest

from fedspeech.edge_client.local_data import DataSource, LocalData, SyntheticMix
from fedspeech.models.clips.tasks import BUILTIN_TASKS, task_from_mapping
from tests.helpers.recordings import copy_takes

pytestmark = [
    pytest.mark.skipif(not shutil.which("espeak-ng"), reason="needs espeak-ng: apt-get install espeak-ng"),
    pytest.mark.timeout(300),
]

DIGITS = task_from_mapping(
    {"name": "digits", "labels": ["0", "1", "2"], "sample_rate": 8000, "clip_seconds": 1.0}
)


def test_synthetic_takes_join_the_training_side_only_and_are_spoken_once(tmp_path, caplog):
    folder = copy_takes(tmp_path / "data", "012", range(5))
    plain = LocalData(DataSource(folder=folder))
    plain.refresh(DIGITS)
    mixed = LocalData(DataSource(folder=folder), mix=SyntheticMix(3, tmp_path / "synthetic"))
    with caplog.at_level(logging.INFO):
        mixed.refresh(DIGITS)
    assert "speaking the task's words" in caplog.text
    own = len(plain.train.labels)
    assert len(mixed.train.labels) == own + 3 * 3
    np.testing.assert_array_equal(mixed.train.waveforms[:own], plain.train.waveforms)
    assert np.bincount(mixed.train.labels[own:]).tolist() == [3, 3, 3]
    assert not np.array_equal(mixed.train.waveforms[own], mixed.train.waveforms[own + 1])
    assert mixed.train.counts == plain.train.counts, "the counts are the device's own clips"
    assert (mixed.train.clips, mixed.train.mixed) == (own, 9), "what it registers and weighs: its own"
    np.testing.assert_array_equal(mixed.test.waveforms, plain.test.waveforms)
    (made,) = (tmp_path / "synthetic").iterdir()
    assert (made / "SOURCE.md").is_file()

    caplog.clear()
    with caplog.at_level(logging.INFO):
        mixed.refresh(DIGITS)  # the next task
        LocalData(DataSource(folder=folder), mix=SyntheticMix(3, tmp_path / "synthetic")).refresh(DIGITS)
    assert list((tmp_path / "synthetic").iterdir()) == [made]
    assert "speaking" not in caplog.text, "the next task, and a restarted device, find the takes made"


def test_without_a_synthesizer_the_device_trains_on_its_own_clips_and_says_so_once(
    tmp_path, caplog, monkeypatch
):
    folder = copy_takes(tmp_path / "data", "012", range(5))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no espeak-ng, flite or festival to be found
    data = LocalData(DataSource(folder=folder), mix=SyntheticMix(3, tmp_path / "synthetic"))
    with caplog.at_level(logging.WARNING, "fedspeech.edge_client.local_data"):
        data.refresh(DIGITS)
        data.refresh(DIGITS)
    assert len(data.train.labels) == sum(data.train.counts.values())
    (warning,) = [r.message for r in caplog.records]
    assert "no synthetic takes mixed in" in warning and "apt-get install espeak-ng" in warning


def test_a_task_of_emotions_mixes_in_nothing(tmp_path, caplog):
    # named as the built-in emotion task, which trains the emotion model
    emotions = task_from_mapping(
        {"name": "emodb", "labels": ["0", "1"], "sample_rate": 8000, "clip_seconds": 1.0}
    )
    folder = copy_takes(tmp_path / "data", "01", range(4))
    data = LocalData(DataSource(folder=folder), mix=SyntheticMix(2, tmp_path / "synthetic"))
    with caplog.at_level(logging.WARNING, "fedspeech.edge_client.local_data"):
        data.refresh(emotions)
    assert len(data.train.labels) == sum(data.train.counts.values())
    assert "feelings" in caplog.text


@pytest.mark.parametrize("takes", [0, -1, 10_000])
def test_a_bad_mix_is_refused(tmp_path, takes):
    with pytest.raises(ValueError, match="synthetic takes to mix in"):
        LocalData(DataSource(folder=tmp_path), mix=SyntheticMix(takes, tmp_path / "synthetic"))


def test_devices_of_other_seeds_mix_in_other_takes(tmp_path):
    folder = copy_takes(tmp_path / "data", "012", range(5))
    first, second = (
        LocalData(DataSource(folder=folder), mix=SyntheticMix(3, tmp_path / "synthetic", seed))
        for seed in (1, 2)
    )
    first.refresh(DIGITS)
    second.refresh(DIGITS)
    assert len(list((tmp_path / "synthetic").iterdir())) == 2
    own = sum(first.train.counts.values())
    assert not np.array_equal(first.train.waveforms[own:], second.train.waveforms[own:])


def test_a_device_mixes_in_a_bounded_number_of_takes(tmp_path):
    from fedspeech.edge_client.daemon import MAX_MIXED_TAKES, ClientConfig
    from fedspeech.protocol.mqtt import BrokerSettings

    def config(takes: int) -> ClientConfig:
        broker, source = BrokerSettings("mqtt://127.0.0.1:1883"), DataSource(folder=tmp_path)
        return ClientConfig("http://127.0.0.1:8080", broker, "d1", source, tmp_path, mix_synthetic=takes)

    config(MAX_MIXED_TAKES).check()
    for takes in (-1, MAX_MIXED_TAKES + 1):
        with pytest.raises(ValueError, match="synthetic takes a word"):
            config(takes).check()


def test_long_clips_get_fewer_takes_so_that_what_is_held_stays_bounded(tmp_path, monkeypatch, caplog):
    from fedspeech.edge_client import local_data

    monkeypatch.setattr(local_data, "MAX_MIXED_BYTES", 2 * 3 * DIGITS.num_samples * 4)  # two takes a word
    folder = copy_takes(tmp_path / "data", "012", range(4))
    data = LocalData(DataSource(folder=folder), mix=SyntheticMix(5, tmp_path / "synthetic"))
    with caplog.at_level(logging.INFO):
        data.refresh(DIGITS)
    own = sum(data.train.counts.values())
    assert np.bincount(data.train.labels[own:]).tolist() == [2, 2, 2]
    assert "training on 2 synthetic takes of each word" in caplog.text


def test_other_speech_counts_in_the_bound_of_what_is_held(tmp_path, monkeypatch, caplog):
    from fedspeech.edge_client import local_data

    fsdd = BUILTIN_TASKS["fsdd"]  # ten digits and _none_: other speech takes as many as the ten together
    monkeypatch.setattr(local_data, "MAX_MIXED_BYTES", 2 * 2 * 10 * fsdd.num_samples * 4)  # two a word
    folder = copy_takes(tmp_path / "data", "01", range(2))
    data = LocalData(DataSource(folder=folder), mix=SyntheticMix(5, tmp_path / "synthetic"))
    with caplog.at_level(logging.INFO):
        data.refresh(fsdd)
    own = sum(data.train.counts.values())
    held = data.train.waveforms[own:]
    assert held.nbytes <= local_data.MAX_MIXED_BYTES
    assert np.bincount(data.train.labels[own:], minlength=11).tolist() == [2] * 10 + [20]
    assert "training on 2 synthetic takes of each word" in caplog.text
