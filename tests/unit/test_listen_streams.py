"""The listening benchmark's rooms, talk and other words: the room's decay and energy, the reverberant
stream's level and timing, talk that leaves out the sentence with a task word in it, and other words that
leave out the task's."""

import tempfile
from pathlib import Path

import numpy as np
import pytest
import soundfile

from fedspeech_bench.listen_streams import (
    OTHER_PAUSE_S,
    TALK_PAUSE_S,
    WORD_RMS,
    Stream,
    Word,
    other_word_paths,
    reverberant,
    reverberant_to_direct,
    rms,
    room_response,
    speech_power,
    talk,
    talk_paths,
    words_alone,
)

RATE = 16000


def decay_rt60_s(response: np.ndarray, sample_rate: int) -> float:
    """The time the tail takes to fall 60 dB, from a line fitted to its energy in 10 ms blocks (dB)."""
    tail = response[1:]
    block = sample_rate // 100
    energy = np.square(tail[: len(tail) // block * block].astype(np.float64)).reshape(-1, block).sum(axis=1)
    times = (np.arange(len(energy)) + 0.5) * block / sample_rate
    slope_db_per_s = np.polyfit(times, 10 * np.log10(energy), 1)[0]
    return -60 / slope_db_per_s


@pytest.mark.parametrize("rt60_s", [0.3, 0.6])
def test_a_room_decays_by_60_db_in_its_rt60(rt60_s):
    response = room_response(rt60_s, RATE, seed=0)
    assert response[0] == 1.0  # the direct path
    assert len(response) == 1 + round(rt60_s * RATE)
    assert decay_rt60_s(response, RATE) == pytest.approx(rt60_s, rel=0.05)
    # the energy of the tail's last 10 ms against its first 10 ms: 60 dB down, less the 10 ms between
    tail = np.square(response[1:].astype(np.float64))
    block = RATE // 100
    down_db = 10 * np.log10(tail[-block:].sum() / tail[:block].sum())
    assert down_db == pytest.approx(-60 * (rt60_s - 0.01) / rt60_s, abs=2.0)
    assert np.sum(tail) == pytest.approx(reverberant_to_direct(rt60_s), rel=1e-4)


def test_a_room_is_seeded_and_a_longer_one_reverberates_more():
    np.testing.assert_array_equal(room_response(0.3, RATE, seed=1), room_response(0.3, RATE, seed=1))
    assert not np.array_equal(room_response(0.3, RATE, seed=1), room_response(0.3, RATE, seed=2))
    assert 1 < reverberant_to_direct(0.3) < reverberant_to_direct(0.6)


def made_up_stream() -> Stream:
    """Three tones of different levels, 0.6 s of silence around each."""
    rng = np.random.default_rng(0)
    pause, parts, words, position = round(0.6 * RATE), [], [], 0
    for label, level in [("1", 0.02), ("2", 0.1), ("3", 0.05)]:
        parts += [np.zeros(pause, np.float32), (level * rng.standard_normal(RATE // 2)).astype(np.float32)]
        words.append(Word(label, position + pause, position + pause + RATE // 2))
        position += pause + RATE // 2
    parts.append(np.zeros(pause, np.float32))
    return Stream(np.concatenate(parts), RATE, words)


@pytest.mark.parametrize("rt60_s", [0.3, 0.6])
def test_a_reverberant_stream_keeps_its_words_their_times_and_their_power(rt60_s):
    dry = made_up_stream()
    wet = reverberant(dry, rt60_s, seed=0)
    assert wet.words == dry.words
    assert len(wet.audio) == len(dry.audio) and wet.audio.dtype == np.float32
    assert 10 * np.log10(speech_power(wet) / speech_power(dry)) == pytest.approx(0.0, abs=0.01)
    gap = wet.audio[dry.words[0].end : dry.words[1].start]
    assert rms(gap[: RATE // 20]) > 0.1 * rms(dry.audio[dry.words[0].start : dry.words[0].end])  # the tail
    np.testing.assert_array_equal(wet.audio, reverberant(dry, rt60_s, seed=0).audio)


def _emodb(root: Path, names: list[str]) -> Path:
    folder = root / "emodb" / "wav"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for n, name in enumerate(names):
        noise = rng.standard_normal(RATE // 2 + 1000 * n)
        level = 0.01 * (n + 1)  # recorded at different levels, and no sample silent: pauses are
        soundfile.write(folder / name, level * np.sign(noise) * (0.5 + np.abs(noise)), RATE)
    return root


def test_talk_leaves_out_the_sentence_with_a_digit_in_it(tmp_path):
    data = _emodb(tmp_path, ["03a01Fa.flac", "03a07Nc.flac", "08b10Wa.flac", "16a05Lb.flac"])
    assert [p.name for p in talk_paths(data)] == ["03a01Fa.flac", "08b10Wa.flac", "16a05Lb.flac"]
    with pytest.raises(FileNotFoundError, match="emodb"):
        talk_paths(tmp_path / "nothing here")


def test_talk_for_the_commands_leaves_out_the_sentences_with_a_commands_german_word_in_it(tmp_path):
    codes = ["a01", "a02", "a04", "a05", "a07", "b01", "b02", "b03", "b09", "b10"]
    data = _emodb(tmp_path, [f"03{code}Fa.flac" for code in codes])
    commands = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go", "_none_"]
    kept = [p.stem[2:5] for p in talk_paths(data, commands)]
    assert kept == ["a04", "a05", "a07", "b01", "b10"]  # auf, ab, gehen, an left out; sieben is no command
    assert "a07" not in [p.stem[2:5] for p in talk_paths(data, [str(d) for d in range(10)])]
    assert len(talk_paths(data, ["yes", "_none_"])) == 10  # no sentence says yes


def test_talk_is_every_utterance_at_the_words_level_with_pauses_between_looped_to_length(tmp_path):
    paths = talk_paths(_emodb(tmp_path, ["03a01Fa.flac", "08b10Wa.flac", "16a05Lb.flac"]))
    length = 10 * RATE  # longer than the three utterances and their pauses: they come round again
    stream = talk(paths, RATE, length, seed=0)
    assert len(stream.audio) == length and stream.words == []
    spoken = np.flatnonzero(np.diff(np.concatenate([[0], stream.audio != 0, [0]]).astype(int)))
    starts, ends = spoken[::2], spoken[1::2]
    pauses_s = (starts - np.concatenate([[0], ends[:-1]])) / RATE
    assert len(starts) > 3
    assert all(TALK_PAUSE_S[0] - 1e-3 <= p <= TALK_PAUSE_S[1] + 1e-3 for p in pauses_s)
    assert len(set(np.round(pauses_s, 3))) > 1  # drawn, not fixed
    full = [rms(stream.audio[s:e]) for s, e in zip(starts, ends, strict=True) if e < length]
    assert full == pytest.approx([WORD_RMS] * len(full), rel=1e-3)
    np.testing.assert_array_equal(stream.audio, talk(paths, RATE, length, seed=0).audio)
    assert not np.array_equal(stream.audio, talk(paths, RATE, length, seed=1).audio)


def _unknown(tmp_path: Path, words: list[str]) -> Path:
    """A data folder with speech_commands_test/_unknown_/<word>_<hash>_nohash_0.flac of a second's tone."""
    folder = tmp_path / "speech_commands_test" / "_unknown_"
    folder.mkdir(parents=True)
    tone = (0.1 + 0.05 * np.sin(np.arange(RATE // 2) / 5)).astype(np.float32)  # never a zero sample
    for n, word in enumerate(words):
        soundfile.write(folder / f"{word}_{n:08x}_nohash_0.flac", tone, RATE)
    return tmp_path


def test_other_words_leave_out_the_tasks_own_words_and_a_digits_name():
    words = ["bed", "one", "seven", "yes", "happy", "nine"]
    data = _unknown(Path(tempfile.mkdtemp()), words)
    digits = [str(d) for d in range(10)] + ["_none_"]
    assert [p.name.split("_")[0] for p in other_word_paths(data, digits)] == ["bed", "happy", "yes"]
    commands = ["yes", "no", "_unknown_"]
    assert [p.name.split("_")[0] for p in other_word_paths(data, commands)] == [
        "bed", "happy", "nine", "one", "seven",
    ]  # fmt: skip
    with pytest.raises(FileNotFoundError, match="other words"):
        other_word_paths(_unknown(Path(tempfile.mkdtemp()), ["one"]), digits)


def test_other_words_leave_out_the_speakers_the_models_trained_on():
    data = _unknown(Path(tempfile.mkdtemp()), ["bed", "cat", "dog", "yes"])  # speakers 00000000 to 00000003
    paths = other_word_paths(data, ["yes", "_none_"], held={"00000001", "00000003"})
    assert [p.name for p in paths] == ["bed_00000000_nohash_0.flac", "dog_00000002_nohash_0.flac"]


def test_other_words_are_said_alone_at_the_words_level_with_a_pause_around_each(tmp_path):
    paths = other_word_paths(_unknown(tmp_path, ["bed", "cat", "dog"]), ["0"])
    stream = words_alone(paths, RATE, seed=0)
    assert stream.words == [] and stream.others == 3  # no task word, three other words
    spoken = np.flatnonzero(np.diff(np.concatenate([[0], stream.audio != 0, [0]]).astype(int)))
    starts, ends = spoken[::2], spoken[1::2]
    assert len(starts) == 3 and starts[0] == OTHER_PAUSE_S * RATE
    assert np.diff(starts).min() >= RATE // 2 + OTHER_PAUSE_S * RATE - 2
    assert [rms(stream.audio[s:e]) for s, e in zip(starts, ends, strict=True)] == pytest.approx(
        [WORD_RMS] * 3
    )
