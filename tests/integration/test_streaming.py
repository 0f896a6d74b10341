"""The speech gate on synthetic frames; the streaming detector on held-out FSDD takes, noise and silence."""

from pathlib import Path

import numpy as np
import pytest
import soundfile

from fedspeech.models.clips.augment import spoken_extents
from fedspeech.runtime.session import OnnxModel
from fedspeech.runtime.speech_gate import FLOOR_BLOCK_S, GateConfig, SpeechGate
from fedspeech.runtime.streaming import (
    CATCH_UP_S,
    DEFAULT_THRESHOLD,
    Detection,
    DetectorConfig,
    StreamingDetector,
    segment_score,
)
from tests.helpers.onnx_files import with_metadata
from tests.helpers.recordings import held_out_digits

RECORDINGS = Path(__file__).resolve().parents[2] / "data" / "fsdd" / "recordings"
RATE, FRAME = 8000, 80  # FSDD's rate; 10 ms frames
DIGITS = [str(digit) for digit in range(10)]
PAUSE_S = 0.6

pytestmark = pytest.mark.timeout(120)


# ---- the gate, on frames of white noise at given levels ----


def frames_at(levels: list[tuple[float, float]], seed: int = 0) -> list[np.ndarray]:
    """Frames of white noise, (seconds, RMS level) after each other."""
    rng = np.random.default_rng(seed)
    frames = []
    for seconds, level in levels:
        for _ in range(round(seconds * 100)):
            frame = rng.standard_normal(FRAME)
            frames.append((level * frame / np.sqrt(np.mean(frame**2))).astype(np.float32))
    return frames


def gate_run(frames: list[np.ndarray], config: GateConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per frame: whether the gate showed it to be speech, and whether a segment was open after it."""
    gate = SpeechGate(config)
    speech, open_ = np.zeros(len(frames), bool), np.zeros(len(frames), bool)
    for i, frame in enumerate(frames):
        count = gate.push(frame)
        speech[i + 1 - count : i + 1] = count > 0
        open_[i] = gate.is_open
    return speech, open_


def segments(mask: np.ndarray) -> list[tuple[int, int]]:
    """(first, last + 1) frame of each run of True."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


QUIET, LOUD = 0.001, 0.05


def test_gate_opens_on_speech_and_closes_after_the_hangover():
    speech, open_ = gate_run(frames_at([(1.0, QUIET), (0.3, LOUD), (1.0, QUIET)]))
    assert segments(speech) == [(100, 130)]  # the loud frames, from the first on
    hangover = round(GateConfig().hangover_s * 100)
    min_run = round(GateConfig().min_speech_s * 100)
    assert segments(open_) == [(100 + min_run - 1, 130 + hangover - 1)]


@pytest.mark.parametrize("pause_s, parts", [(0.1, 1), (0.3, 2)])
def test_gate_bridges_a_pause_inside_a_word_not_between_words(pause_s, parts):
    speech, _ = gate_run(frames_at([(1.0, QUIET), (0.2, LOUD), (pause_s, QUIET), (0.2, LOUD), (1.0, QUIET)]))
    pause = round(pause_s * 100)
    expected = [(100, 140 + pause)] if parts == 1 else [(100, 120), (120 + pause, 140 + pause)]
    assert segments(speech) == expected


def test_gate_ignores_clicks():
    click = [(1.0, QUIET), (0.04, 0.5), (1.0, QUIET)]  # 40 ms, loud
    speech, open_ = gate_run(frames_at(click * 3))
    assert not speech.any() and not open_.any()
    speech, _ = gate_run(frames_at([(1.0, QUIET), (0.05, LOUD), (1.0, QUIET)]))
    assert segments(speech) == [(100, 105)]  # 50 ms is speech


def test_gate_follows_a_raised_noise_floor():
    steady = GateConfig().floor_s + FLOOR_BLOCK_S + GateConfig().hangover_s  # the jump has left the floor
    room = [(3.0, 0.002), (6.0, 0.02)]  # a quiet room, then a fan at -34 dBFS
    speech, open_ = gate_run(frames_at(room + [(0.3, 0.1), (1.0, 0.02)]))
    settled = round((3.0 + steady) * 100)
    assert not open_[:300].any()  # steady noise never opens it
    assert not open_[settled:900].any()  # after the jump, the floor has followed the fan
    assert segments(speech[900:]) == [(0, 30)]  # a voice 14 dB over the fan still opens it
    assert not gate_run(frames_at([(5.0, 0.002)]))[1].any()  # nor does hiss under the minimum level


# ---- the detector on FSDD ----


@pytest.fixture(scope="module")
def calibrated(fsdd_model) -> Path:
    """The session's model, exported with its threshold calibrated on its held-out clips."""
    return fsdd_model.onnx_path


def take(speaker: str, number: int) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """A speaker's held-out take of 0 to 9, PAUSE_S apart and around, and a window of silence; the spans."""
    audio, spans = held_out_digits(DIGITS, speaker, number, PAUSE_S)
    return np.concatenate([audio, np.zeros(RATE, np.float32)]), spans


def detect(detector: StreamingDetector, audio: np.ndarray) -> list[Detection]:
    """The detections of audio pushed frame by frame."""
    frames = audio[: len(audio) // FRAME * FRAME].reshape(-1, FRAME)
    return [d for d in map(detector.push, frames) if d is not None]


@pytest.mark.parametrize("speaker, number", [("lucas", 1), ("george", 3), ("theo", 0)])
def test_each_digit_of_a_take_is_detected_once_in_order(calibrated, speaker, number):
    audio, spans = take(speaker, number)
    model = OnnxModel(calibrated)
    detector = StreamingDetector(model, timings=True)
    found = detect(detector, audio)
    labels = [d.label for d in found]
    remaining = iter(DIGITS)
    assert all(label in remaining for label in labels), f"{labels} is not 0-9 in order, each once"
    assert len(labels) >= 9, f"only {len(labels)} of 10 detected: {labels}"
    for d in found:
        start, end = spans[int(d.label)]
        assert start < d.time_s <= end + 0.02, (d, start, end)  # the end of its speech
        assert d.confidence >= detector.threshold == float(model.metadata["threshold"])
    # only windows centred in speech were classified: a few per word, none in the pauses
    hops = len(audio) // (RATE // 10)
    assert 10 * 2 <= detector.timings.windows <= hops // 2


def test_a_none_class_is_never_reported(calibrated, tmp_path):
    model = OnnxModel(calibrated)
    labels = model.labels
    labels[3] = "_none_"  # 3's column now means "no word"
    renamed = OnnxModel(with_metadata(calibrated, tmp_path / "none.onnx", labels))
    audio, _ = take("george", 3)
    found = [d.label for d in detect(StreamingDetector(model), audio)]
    assert "3" in found and len(found) >= 9
    assert [d.label for d in detect(StreamingDetector(renamed), audio)] == [x for x in found if x != "3"]


def test_noise_alone_detects_nothing_and_runs_no_model(calibrated):
    model, rng = OnnxModel(calibrated), np.random.default_rng(0)
    for level in (0.0, 0.001, 0.02, 0.1):  # digital silence, hiss, a fan, a loud fan
        detector = StreamingDetector(model, timings=True)
        assert detect(detector, (level * rng.standard_normal(30 * RATE)).astype(np.float32)) == []
        assert detector.timings.windows == 0, level


def test_threshold_from_metadata_or_given(fsdd_model, tmp_path):
    audio, _ = take("george", 3)
    model = OnnxModel(with_metadata(fsdd_model.onnx_path, tmp_path / "none.onnx", threshold=None))
    assert StreamingDetector(model).threshold == DEFAULT_THRESHOLD

    strict = OnnxModel(with_metadata(fsdd_model.onnx_path, tmp_path / "strict.onnx", threshold="0.999"))
    detector = StreamingDetector(strict)
    assert (detector.threshold, detector.threshold_origin) == (0.999, "calibrated, from the model's metadata")
    found = detect(detector, audio)
    assert all(d.confidence >= 0.999 for d in found)

    given = StreamingDetector(strict, DetectorConfig(threshold=0.3))
    assert (given.threshold, given.threshold_origin) == (0.3, "given")
    more = detect(given, audio)
    assert len(more) >= 9 and len(more) > len(found) and all(d.confidence >= 0.3 for d in more)

    for bad in ("1.5", "0", "nan", "high"):
        broken = OnnxModel(with_metadata(fsdd_model.onnx_path, tmp_path / "bad.onnx", threshold=bad))
        with pytest.raises(ValueError, match="threshold .* is not a probability"):
            StreamingDetector(broken)
        with pytest.raises(ValueError, match="is not a probability"):
            detector.swap(broken)
        assert detector.model is strict and detector.threshold == 0.999
    with pytest.raises(ValueError, match="probability in"):
        StreamingDetector(model, DetectorConfig(threshold=1.5))


# ---- deciding, on a model that answers from a script ----


def test_segment_score_is_the_mean_of_the_best_windows():
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.6, 0.4]])
    assert segment_score(probabilities, 2) == (0, pytest.approx(0.8))  # (0.9 + 0.7) / 2 against 0.6
    assert segment_score(probabilities[:1], 3) == (0, pytest.approx(0.9))  # a whole segment of one window
    assert segment_score(probabilities[:1], 3, whole=False) == (0, pytest.approx(0.3))  # a piece of one


def says_a(voice: bool = True) -> StreamingDetector:
    """A detector, with timings, on a model that takes every window for the word a, confidently."""
    model = ScriptedModel("a" * 1000)
    return StreamingDetector(model, DetectorConfig(voice=voice), timings=True)  # type: ignore[arg-type]


class ScriptedModel:
    """Stands in for an OnnxModel of 1 s at 8 kHz: answers each window with the next class of a script.

    The script names a class per window: a, b, or _ for none.
    """

    sample_rate, num_samples, metadata = RATE, RATE, {}
    labels = ["a", "b", "_none_"]

    def __init__(self, script: str) -> None:
        self.script = iter(script)

    def predict(self, window: np.ndarray) -> np.ndarray:
        probabilities = np.full((1, 3), 0.025, np.float32)
        probabilities[0, "ab_".index(next(self.script))] = 0.95
        return probabilities


@pytest.mark.parametrize("seconds", [0.9, 1.0, 1.5])
def test_a_word_cut_at_max_segment_does_not_hide_the_next(seconds):
    """A segment cut at max_segment_s, ending right after the cut: the same word said next is detected."""
    levels = [(0.5, QUIET), (seconds, 0.1), (PAUSE_S, QUIET), (0.5, 0.1), (1.5, QUIET)]
    found = detect(says_a(voice=False), np.concatenate(frames_at(levels)))
    assert [d.label for d in found] == ["a", "a"], [(d.label, d.time_s) for d in found]


@pytest.mark.parametrize(
    "script, expected",
    [
        ("aaaaaabbbbbb", ["a", "b"]),  # two words the gate could not part
        ("aaaaaa____bbbbbb", ["a", "b"]),  # with noise between them
        ("aaaabaaaa", ["a"]),  # a flicker inside one word
        ("a" * 15, ["a"]),  # a word cut at max_segment_s
        ("__________", []),  # noise the gate let through
    ],
)
def test_words_run_together_are_told_apart(script, expected):
    model = ScriptedModel(script + "_" * 20)
    # white noise stands in for the words: the energy gate alone, the VAD would veto it
    detector = StreamingDetector(model, DetectorConfig(voice=False))  # type: ignore[arg-type]
    loud = np.concatenate(frames_at([(0.5, QUIET), (len(script) / 10, 0.1), (1.5, QUIET)]))
    assert [d.label for d in detect(detector, loud)] == expected


# ---- voice: noise and talk the energy gate lets through ----


def joined(names: list[str], pause_s: float = 0.0, trim: bool = False) -> np.ndarray:
    """FSDD recordings one after the other, pause_s apart; trim: each cut to its spoken part first."""
    pause = np.zeros(round(pause_s * RATE), np.float32)
    parts = [soundfile.read(RECORDINGS / f"{name}.flac", dtype="float32")[0] for name in names]
    if trim:
        parts = [spoken(part) for part in parts]
    return np.concatenate([x for part in parts for x in (part, pause)])


def spoken(recording: np.ndarray) -> np.ndarray:
    """The recording from its first to its last 10 ms frame above a tenth of its loudest's level."""
    (start,), (end,) = spoken_extents(recording[None], FRAME, 0.1)
    return recording[start:end]


# twelve digits of six speakers; joined cut to their spoken parts, about 4 s of talk with no pause as long
# as the gate's hangover
TALK = ["3_jackson_10", "7_george_20", "5_lucas_30", "0_nicolas_40", "9_theo_45", "1_yweweler_15"]
TALK += ["2_jackson_0", "8_george_1", "6_lucas_12", "4_nicolas_25", "5_jackson_33", "2_lucas_8"]


def test_knocks_are_no_words():
    """Loud bursts of noise open the gate like words; the model would take them for one, the VAD vetoes."""
    bursts = []
    for seconds in (0.3, 0.4, 0.5, 0.35, 0.45):
        bursts += [(1.0, QUIET), (seconds, 0.1)]
    audio = np.concatenate(frames_at(bursts + [(1.5, QUIET)]))
    assert [d.label for d in detect(says_a(voice=False), audio)] == ["a"] * 5
    assert detect(says_a(), audio) == []


def test_the_vad_rests_while_the_gate_hears_no_sound():
    """Silence costs the VAD nothing; a sound wakes it, and it hears the CATCH_UP_S before the sound first."""
    detector = says_a()
    assert detector.voice is not None
    heard: list[np.ndarray] = []
    push = detector.voice.push
    detector.voice.push = lambda frame: heard.append(frame.copy()) or push(frame)  # type: ignore[method-assign]
    frames = frames_at([(2.0, QUIET), (0.3, 0.1), (2.0, QUIET)])
    for frame in frames[:200]:
        detector.push(frame)
    assert heard == []
    for frame in frames[200:]:
        detector.push(frame)
    opened = 200 + round(GateConfig().min_speech_s * 100) - 1  # the frame that opens the gate
    back = round(CATCH_UP_S * 100)
    assert np.array_equal(
        np.concatenate(heard[: back + 1]), np.concatenate(frames[opened - back : opened + 1])
    )
    # then the sound and the hangover, not the quiet after it
    hangover = round(GateConfig().hangover_s * 100)
    assert len(heard) == back + (230 - opened) + hangover - 1


@pytest.mark.parametrize("pause_s", [0.0, 0.05])
def test_talk_detects_nothing_and_stops_classifying(pause_s):
    """Speech longer than any word: the energy gate alone hears a word in it, the VAD hears talk."""
    talk = joined(TALK, pause_s, trim=True)
    assert len(talk) >= 3.5 * RATE
    audio = np.concatenate([np.zeros(RATE, np.float32), talk, np.zeros(2 * RATE, np.float32)])
    energy, voiced = says_a(voice=False), says_a()
    assert detect(energy, audio) != []
    assert detect(voiced, audio) == []
    # the first max_segment_s of windows are classified, then nothing until the talk ends
    assert voiced.timings.windows <= round(1000 * voiced.config.max_segment_s / voiced.config.hop_ms)
    assert voiced.timings.windows < energy.timings.windows / 2


def talk_then(word: str) -> tuple[np.ndarray, tuple[float, float]]:
    """TALK, a pause between words (PAUSE_S), then a word on its own: the audio, and the word's span."""
    pause = np.zeros(round(PAUSE_S * RATE), np.float32)
    talk, command = joined(TALK), joined([word])
    audio = np.concatenate([pause, talk, pause, command, np.zeros(RATE, np.float32)])
    start = (2 * len(pause) + len(talk)) / RATE
    return audio, (start, start + len(command) / RATE)


def test_a_word_after_talk_is_heard():
    """Talk stops the classifying until it ends; the word said after it is classified and detected."""
    audio, (start, end) = talk_then("4_theo_2")
    assert any(d.time_s < start for d in detect(says_a(voice=False), audio))  # a word in the talk
    found = detect(says_a(), audio)
    assert [d.label for d in found] == ["a"]
    assert start < found[0].time_s <= end + 0.02


@pytest.mark.parametrize("word", ["4_theo_2", "7_lucas_1", "9_george_4"])
def test_talk_of_known_words_detects_only_the_word_after_it(calibrated, word):
    """The real model on TALK, digits it knows run together: talk detects nothing, the word after it does."""
    audio, (start, end) = talk_then(word)
    found = detect(StreamingDetector(OnnxModel(calibrated)), audio)
    assert [d.label for d in found] == [word[0]], [(d.label, d.time_s) for d in found]
    assert start < found[0].time_s <= end + 0.02


@pytest.mark.parametrize("name", ["min_voice", "talk_voice", "talk_share"])
def test_voice_settings_are_probabilities(name):
    for good in (0.0, 1.0):
        StreamingDetector(ScriptedModel(""), DetectorConfig(**{name: good}))  # type: ignore[arg-type]
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=f"{name} must be between 0 and 1"):
            StreamingDetector(ScriptedModel(""), DetectorConfig(**{name: bad}))  # type: ignore[arg-type]
