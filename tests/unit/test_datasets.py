"""Corpus listing, speaker partitions and audio loading, on the real corpora."""

import numpy as np
import pytest
import soundfile

from fedspeech.models.clips.datasets import (
    AudioError,
    bundled_data_dir,
    client_clips,
    default_spec,
    leave_one_speaker_out,
    load_audio,
    load_corpus,
    load_waveforms,
    server_test_clips,
    speakers,
)
from tests.helpers.shared_data import SHARED_DATA, needs_shared


@pytest.fixture(scope="module")
def fsdd():
    return load_corpus("fsdd")


def test_bundled_fsdd_speakers_and_official_split(fsdd):
    assert fsdd.labels == tuple("0123456789")
    assert fsdd.sample_rate == 8000
    assert speakers(fsdd) == ["george", "jackson", "lucas", "nicolas", "theo", "yweweler"]
    for speaker in speakers(fsdd):
        train, test = client_clips(fsdd, speaker)
        assert (len(train), len(test)) == (450, 50)
        assert all(int(clip.path.stem.split("_")[2]) < 5 for clip in test)
        assert all(int(clip.path.stem.split("_")[2]) >= 5 for clip in train)
        assert {clip.label for clip in test} == set(range(10))


def test_bundled_fsdd_ships_its_license():
    folder = bundled_data_dir() / "fsdd"
    assert "creativecommons.org/licenses/by-sa/4.0" in (folder / "LICENSE").read_text()
    assert "CC BY-SA 4.0" in (folder / "SOURCE.md").read_text()


def test_server_test_is_union_of_client_tests(fsdd):
    union = {clip for speaker in speakers(fsdd) for clip in client_clips(fsdd, speaker)[1]}
    assert set(server_test_clips(fsdd)) == union
    assert len(server_test_clips(fsdd)) == 300


def test_leave_one_speaker_out(fsdd):
    train, held_out = leave_one_speaker_out(fsdd, "theo")
    assert len(held_out) == 500 and all(clip.speaker == "theo" for clip in held_out)
    assert len(train) == 5 * 450
    assert not any(clip.speaker == "theo" or clip.test for clip in train)


def test_unknown_corpus_speaker_and_missing_folder(fsdd, tmp_path):
    with pytest.raises(ValueError, match="unknown corpus"):
        load_corpus("timit")
    with pytest.raises(FileNotFoundError, match="emodb"):
        load_corpus("emodb", tmp_path)
    with pytest.raises(ValueError, match="no speaker"):
        client_clips(fsdd, "nobody")


def _check_speaker_split(corpus):
    for speaker in speakers(corpus):
        train, test = client_clips(corpus, speaker)
        total = len(train) + len(test)
        assert not set(train) & set(test)
        assert len(test) == max(1, round(0.2 * total))


@needs_shared
def test_emodb_split_deterministic_and_disjoint():
    corpus = load_corpus("emodb", SHARED_DATA)
    assert corpus.sample_rate == 16000 and len(corpus.clips) == 535
    assert speakers(corpus) == ["03", "08", "09", "10", "11", "12", "13", "14", "15", "16"]
    assert load_corpus("emodb", SHARED_DATA) == corpus
    _check_speaker_split(corpus)
    anger = corpus.labels.index("anger")
    assert all((clip.path.stem[5] == "W") == (clip.label == anger) for clip in corpus.clips)
    assert {clip.speaker for clip in server_test_clips(corpus)} == set(speakers(corpus))


@needs_shared
def test_speech_commands_speakers_and_split():
    corpus = load_corpus("speech_commands", SHARED_DATA)
    assert len(corpus.labels) == 12 and len(corpus.clips) == 4890
    assert len(speakers(corpus)) == 240  # 239 speaker hashes and the silence pseudo-speaker
    assert load_corpus("speech_commands", SHARED_DATA) == corpus
    _check_speaker_split(corpus)
    silence = [clip for clip in corpus.clips if corpus.labels[clip.label] == "_silence_"]
    assert len(silence) == 408 and {clip.speaker for clip in silence} == {"_silence_"}
    unknown = next(clip for clip in corpus.clips if clip.path.name == "backward_0c540988_nohash_0.flac")
    assert unknown.speaker == "0c540988" and corpus.labels[unknown.label] == "_unknown_"
    train, test = client_clips(corpus, "0c540988")
    assert unknown in train + test
    assert len({clip.label for clip in train + test}) > 1


def test_resampling_8k_to_16k(tmp_path):
    rate, seconds = 8000, 0.5
    t = np.arange(int(rate * seconds)) / rate
    soundfile.write(tmp_path / "tone.flac", 0.5 * np.sin(2 * np.pi * 440 * t), rate)
    audio = load_audio(tmp_path / "tone.flac", 16000, 8000)
    assert audio.shape == (8000,) and audio.dtype == np.float32
    expected = 0.5 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000)
    assert np.max(np.abs(audio[200:-200] - expected[200:-200])) < 1e-2


def test_real_clip_resampled_has_twice_the_samples(fsdd):
    path = fsdd.clips[0].path
    native = soundfile.info(str(path)).frames
    audio = load_audio(path, 16000, 4 * native)
    nonzero = np.flatnonzero(audio)
    assert abs((nonzero[-1] - nonzero[0] + 1) - 2 * native) <= 4


def test_centre_crop_and_pad(tmp_path):
    ramp = np.arange(1, 101, dtype=np.float32) / 100
    soundfile.write(tmp_path / "ramp.wav", ramp, 8000, subtype="FLOAT")
    np.testing.assert_array_equal(load_audio(tmp_path / "ramp.wav", 8000, 10), ramp[45:55])
    padded = load_audio(tmp_path / "ramp.wav", 8000, 120)
    np.testing.assert_array_equal(padded[10:110], ramp)
    assert not padded[:10].any() and not padded[110:].any()


def test_stereo_is_averaged(tmp_path):
    left = np.linspace(-0.5, 0.5, 800, dtype=np.float32)
    right = np.full(800, 0.25, dtype=np.float32)
    soundfile.write(tmp_path / "stereo.wav", np.stack([left, right], axis=1), 8000, subtype="FLOAT")
    np.testing.assert_allclose(load_audio(tmp_path / "stereo.wav", 8000, 800), (left + right) / 2, atol=1e-7)


def test_audio_errors(tmp_path):
    (tmp_path / "empty.flac").write_bytes(b"")
    (tmp_path / "corrupt.flac").write_bytes(b"fLaC" + bytes(range(256)) * 4)
    soundfile.write(tmp_path / "silent.wav", np.zeros(0, dtype=np.float32), 8000)
    reasons = {"empty.flac": "empty file", "corrupt.flac": "corrupt", "silent.wav": "no samples"}
    reasons["missing.flac"] = "no such file"
    for name, reason in reasons.items():
        with pytest.raises(AudioError, match=f"{name}: .*{reason}"):
            load_audio(tmp_path / name, 8000, 8000)


def test_load_waveforms_and_default_spec(fsdd):
    clips = client_clips(fsdd, "lucas")[1][:12]
    spec = default_spec(fsdd)
    # the digits and _none_
    assert (spec.name, spec.sample_rate, spec.num_samples, spec.num_classes) == ("cnn", 8000, 8000, 11)
    waveforms, labels = load_waveforms(clips, spec.sample_rate, spec.num_samples)
    assert waveforms.shape == (12, 8000) and waveforms.dtype == np.float32
    assert labels.dtype == np.int64 and labels.tolist() == [clip.label for clip in clips]
    assert np.all(np.abs(waveforms).max(axis=1) > 0.01)
    assert default_spec(fsdd, seconds=0.5).num_samples == 4000
