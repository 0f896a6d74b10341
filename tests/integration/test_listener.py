"""The Listener, the runtime's one entry point: blocks of any size, format and rate give the same words."""

import numpy as np
import pytest
import soxr

from fedspeech.runtime.listener import Listener
from fedspeech.runtime.session import ModelError
from fedspeech.runtime.streaming import model_round
from tests.helpers.recordings import held_out_digits

RATE = 8000
SPOKEN = ["3", "7", "1", "9"]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def recording() -> np.ndarray:
    """Held-out takes of four digits, 0.6 s apart and around, at FSDD's 8 kHz."""
    return held_out_digits(SPOKEN, "jackson", 0)[0]


def heard(listener: Listener, blocks: list) -> list[str]:
    """The labels the listener detects in the blocks and at the end of the stream, with on_detection's."""
    detections = [d for block in blocks for d in listener.feed(block)] + listener.flush()
    return [d.label for d in detections]


def test_the_words_are_heard_whole_or_in_blocks_of_any_size_as_float_int16_or_bytes(fsdd_model, recording):
    whole = heard(Listener(fsdd_model.onnx_path), [recording])
    assert whole == SPOKEN
    rng = np.random.default_rng(0)
    cuts = np.cumsum(rng.integers(1, 3000, size=len(recording) // 500))
    blocks = np.split(recording, cuts[cuts < len(recording)])
    int16 = [np.round(block * 32767).astype(np.int16) for block in blocks]
    assert heard(Listener(fsdd_model.onnx_path), blocks) == whole
    assert heard(Listener(fsdd_model.onnx_path), int16) == whole
    assert heard(Listener(fsdd_model.onnx_path), [block.tobytes() for block in int16]) == whole
    stereo = [np.stack([block, block], axis=1) for block in blocks]
    assert heard(Listener(fsdd_model.onnx_path), stereo) == whole


@pytest.mark.parametrize("rate", [16000, 44100])
def test_audio_at_another_rate_is_resampled_to_the_models(fsdd_model, recording, rate):
    audio = soxr.resample(recording, RATE, rate)
    listener = Listener(fsdd_model.onnx_path, sample_rate=rate)
    assert heard(listener, np.array_split(audio, 97)) == SPOKEN
    assert listener.seconds == pytest.approx(len(recording) / RATE + 1.0, abs=0.05)  # and a window of silence


def test_callbacks_hear_each_detection_and_the_model_and_reset_starts_the_clock_again(fsdd_model, recording):
    said, models = [], []
    listener = Listener(fsdd_model.onnx_path, on_detection=said.append, on_model=models.append)
    assert [model.describe() for model in models] == [listener.model.describe()]
    assert listener.model.words == [str(digit) for digit in range(10)]
    first = heard(listener, [recording])
    assert [d.label for d in said] == first and {d.model_round for d in said} == {model_round(listener.model)}
    listener.reset()
    assert listener.seconds == 0
    again = heard(listener, [recording])
    assert again == first and [d.time_s for d in said[len(first) :]] == [d.time_s for d in said[: len(first)]]


def test_bad_input_is_refused_in_one_line(fsdd_model, tmp_path):
    with pytest.raises(ModelError, match="no such model file"):
        Listener(tmp_path / "missing.onnx")
    listener = Listener(fsdd_model.onnx_path)
    with pytest.raises(ValueError, match="whole 16-bit samples"):
        listener.feed(b"\x00\x01\x02")
    with pytest.raises(ValueError, match="int16 or float"):
        listener.feed(np.zeros(80, np.int32))
    with pytest.raises(ValueError, match="shape"):
        listener.feed(np.zeros((2, 2, 2), np.float32))
    with pytest.raises(ValueError, match="positive"):
        Listener(fsdd_model.onnx_path, sample_rate=0)
