"""Silero VAD frame by frame on FSDD's spoken digits, white noise and silence, at 8 and 16 kHz."""

from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr

from fedspeech.runtime.voice_activity import MIN_VOICE, VoiceActivity, peak_probability

RECORDINGS = Path(__file__).resolve().parents[2] / "data" / "fsdd" / "recordings"
RATE = 8000  # FSDD's
# two digits of each of FSDD's six speakers
CLIPS = [
    f"{(i + k) % 10}_{speaker}_{7 * i + k}"
    for i, speaker in enumerate(["george", "jackson", "lucas", "nicolas", "theo", "yweweler"])
    for k in (0, 4)
]

pytestmark = pytest.mark.timeout(120)


def clip(name: str) -> np.ndarray:
    """An FSDD recording, float32 at 8 kHz."""
    audio, rate = soundfile.read(RECORDINGS / f"{name}.flac", dtype="float32")
    assert rate == RATE
    return audio


def silence(seconds: float, rate: int = RATE) -> np.ndarray:
    return np.zeros(round(seconds * rate), np.float32)


def pushed(audio: np.ndarray, rate: int, frame: int) -> np.ndarray:
    """The probability after each frame of audio, fed frame by frame (its last part frame left out)."""
    voice = VoiceActivity(rate)
    return np.array([voice.push(audio[i : i + frame]) for i in range(0, len(audio) - frame + 1, frame)])


def test_spoken_digits_are_voice():
    peaks = {name: peak_probability(clip(name), RATE) for name in CLIPS}
    assert min(peaks.values()) >= MIN_VOICE, peaks
    assert sum(peak >= 0.5 for peak in peaks.values()) >= len(CLIPS) - 2, peaks


@pytest.mark.parametrize("level", [0.0, 0.003, 0.03, 0.3])  # digital silence, hiss, a fan, a roar
def test_noise_and_silence_are_not_voice(level):
    rng = np.random.default_rng(0)
    noise = (level * rng.standard_normal(3 * RATE)).astype(np.float32)
    assert peak_probability(noise, RATE) < MIN_VOICE
    assert pushed(noise, RATE, 80).max() < MIN_VOICE


def test_probability_follows_the_word():
    """Low in the silence before, high in the word, low again a little after it."""
    word = clip("7_george_20")
    probability = pushed(np.concatenate([silence(1.0), word, silence(1.0)]), RATE, 80)  # one per 10 ms
    end = 100 + len(word) // 80
    assert probability[:100].max() < MIN_VOICE
    assert probability[100 : end + 10].max() >= 0.5  # a chunk (32 ms) and the resampler's delay late
    assert probability[end + 30 :].max() < MIN_VOICE


@pytest.mark.parametrize("name", CLIPS)
def test_same_peak_at_either_rate_and_any_frame_size(name):
    """The frame size changes nothing; the rate moves the 32 ms chunks against the word a little."""
    audio = np.concatenate([silence(0.5), clip(name), silence(0.5)])
    wide = soxr.resample(audio, RATE, 16000).astype(np.float32)
    narrow = [pushed(audio, RATE, frame).max() for frame in (80, 160, 333)]
    broad = [pushed(wide, 16000, frame).max() for frame in (80, 160, 333)]
    assert narrow == pytest.approx([narrow[0]] * 3, abs=0.01)
    assert broad == pytest.approx([broad[0]] * 3, abs=0.01)
    assert narrow[0] >= MIN_VOICE
    # a short word's peak depends on where the chunks fall: 99% of FSDD's digits within 0.17
    assert abs(narrow[0] - broad[0]) < 0.2, (narrow, broad)


@pytest.mark.parametrize("rate", [RATE, 16000])
def test_peak_probability_is_the_peak_of_the_frames_pushed(rate):
    for name in CLIPS[:4]:
        audio = np.concatenate([silence(0.3), clip(name), silence(0.3)])
        if rate != RATE:
            audio = soxr.resample(audio, RATE, rate).astype(np.float32)
        assert peak_probability(audio, rate) == pytest.approx(pushed(audio, rate, 160).max(), abs=0.02), name
