"""Word detection on an endless audio stream with an exported model; numpy and onnxruntime only, never torch.

In the style of openWakeWord: audio arrives in fixed frames (`frame_ms`, 10 ms by default) at the model's
sample rate and is written into a preallocated ring buffer that holds exactly one model window
(`num_samples`, 1 s for the fedspeech models). Every hop (`hop_ms`, 100 ms by default, counted in frames
from the start of the stream) the newest window is classified, unless it is silent. Each hop:

1. Energy gate: if the RMS of the whole window is below `energy_threshold`, the model is not run, and the
   smoothing history is cleared (silence ends a word): silence costs one sum of 100 numbers per hop. The
   whole window is measured, not the newest hop, because a word is seen best when it sits in the middle of
   the window, with silence after it.
2. Smoothing: the class probabilities of the last `smoothing` windows are averaged; right after silence
   the missing windows count as zeros, so it takes `smoothing` windows in a row that agree to detect
   anything, never one lucky window.
3. Rising edge: a detection fires when the largest averaged probability reaches `threshold` after the
   window was silent, or below the threshold over a full smoothing history, at an earlier hop. A word
   stays in the window for up to a second, seen by many windows, but its probability rises over the
   threshold once: one word, one detection.
4. Refractory period: a rising edge within `refractory_s` of the previous detection is ignored, so a
   probability that flickers around the threshold during one word still gives one detection.

A detection's time is the stream time of the newest sample of the window it was made from.

`swap` replaces the model between two frames: the ring buffer, the frame count and the detection state go
on untouched, so no audio is lost and a word the old model detected is not detected again by the new one.
The smoothing history is kept when the new model has the same labels (successive rounds of one task: their
probabilities cross-fade over `smoothing` windows) and cleared otherwise. A model with another sample rate
or window length is refused with a ValueError: its windows would be different audio, and whatever feeds
the detector runs at the old rate.

The detector has no threads of its own: whoever owns the audio calls `push` for every frame, and `swap`
between two calls.
"""

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from fedspeech.edge_client.onnx_model import OnnxModel


@dataclass(frozen=True)
class Detection:
    """One detected word: its label, its smoothed probability and the stream time of its window's end."""

    label: str
    confidence: float
    time_s: float


@dataclass(frozen=True)
class DetectorConfig:
    """Frame and hop sizes and the detection rules (see the module docstring)."""

    frame_ms: float = 10.0
    hop_ms: float = 100.0
    threshold: float = 0.6
    smoothing: int = 3
    energy_threshold: float = 0.002
    refractory_s: float = 0.5


@dataclass
class StageTimes:
    """Seconds spent per classified window in each stage: ring-buffer copy, inference, post-processing."""

    windows: int = 0
    copy_s: float = 0.0
    inference_s: float = 0.0
    post_s: float = 0.0
    max_copy_s: float = 0.0
    max_inference_s: float = 0.0
    max_post_s: float = 0.0

    def add(self, copy_s: float, inference_s: float, post_s: float) -> None:
        """Count one classified window."""
        self.windows += 1
        self.copy_s += copy_s
        self.inference_s += inference_s
        self.post_s += post_s
        self.max_copy_s = max(self.max_copy_s, copy_s)
        self.max_inference_s = max(self.max_inference_s, inference_s)
        self.max_post_s = max(self.max_post_s, post_s)

    def summary(self) -> str:
        """One line: mean and max milliseconds per window of each stage."""
        if not self.windows:
            return "no window classified"
        n = self.windows
        return (
            f"{n} windows classified, ms per window (mean/max): "
            f"copy {1e3 * self.copy_s / n:.3f}/{1e3 * self.max_copy_s:.3f}, "
            f"inference {1e3 * self.inference_s / n:.3f}/{1e3 * self.max_inference_s:.3f}, "
            f"post {1e3 * self.post_s / n:.3f}/{1e3 * self.max_post_s:.3f}"
        )


class StreamingDetector:
    """Fed fixed-size frames with `push`, it classifies a sliding window every hop and emits detections."""

    def __init__(self, model: OnnxModel, config: DetectorConfig | None = None, timings: bool = False):
        self.config = config or DetectorConfig()
        self.sample_rate = model.sample_rate
        self.num_samples = model.num_samples
        self.frame_size = round(self.sample_rate * self.config.frame_ms / 1000)
        hop_size = round(self.sample_rate * self.config.hop_ms / 1000)
        if not 0 < self.frame_size <= self.num_samples:
            raise ValueError(f"a frame of {self.config.frame_ms} ms does not fit the model's window")
        if hop_size < self.frame_size or hop_size % self.frame_size:
            raise ValueError(f"hop ({self.config.hop_ms} ms) must be a multiple of the frame")
        if self.config.smoothing < 1:
            raise ValueError("smoothing must be at least 1 window")
        self.hop_frames = hop_size // self.frame_size
        self.frames = 0  # frames pushed since the start of the stream
        self.timings = StageTimes() if timings else None
        self._model = model
        self._labels = model.labels
        self._ring = np.zeros(self.num_samples, dtype=np.float32)
        self._pos = 0  # where the next sample goes; also the oldest sample of the window
        self._window = np.zeros((1, self.num_samples), dtype=np.float32)
        # energy (sum of squares) of the frames of the last window, a ring of its own
        self._energies = np.zeros(max(1, self.num_samples // self.frame_size), dtype=np.float64)
        self._history: deque[np.ndarray] = deque(maxlen=self.config.smoothing)
        self._last_detection_s: float | None = None
        self._armed = True

    @property
    def model(self) -> OnnxModel:
        """The model in use."""
        return self._model

    @property
    def samples(self) -> int:
        """Samples pushed since the start of the stream."""
        return self.frames * self.frame_size

    def swap(self, model: OnnxModel) -> None:
        """Use model from the next window on; the buffered audio and the stream clock go on untouched."""
        if (model.sample_rate, model.num_samples) != (self.sample_rate, self.num_samples):
            raise ValueError(
                f"cannot swap to a model of {model.num_samples} samples at {model.sample_rate} Hz: "
                f"the stream runs windows of {self.num_samples} samples at {self.sample_rate} Hz"
            )
        if model.labels != self._labels:
            self._history.clear()
        self._model = model
        self._labels = model.labels

    def push(self, frame: np.ndarray) -> Detection | None:
        """Add one frame of frame_size float samples; return a detection if this frame's window makes one."""
        if frame.shape != (self.frame_size,):
            raise ValueError(f"expected a frame of shape ({self.frame_size},), got {frame.shape}")
        end = self._pos + self.frame_size
        if end <= self.num_samples:
            self._ring[self._pos : end] = frame
        else:  # the frame wraps around the end of the ring
            split = self.num_samples - self._pos
            self._ring[self._pos :] = frame[:split]
            self._ring[: self.frame_size - split] = frame[split:]
        self._pos = end % self.num_samples
        self._energies[self.frames % len(self._energies)] = np.dot(frame, frame)
        self.frames += 1
        if self.frames % self.hop_frames:
            return None
        return self._evaluate()

    def _evaluate(self) -> Detection | None:
        """Classify the current window, unless it is silent, and apply the detection rules."""
        rms = np.sqrt(self._energies.sum() / (len(self._energies) * self.frame_size))
        if rms < self.config.energy_threshold:
            self._history.clear()
            self._armed = True
            return None
        start = time.perf_counter()
        tail = self.num_samples - self._pos
        self._window[0, :tail] = self._ring[self._pos :]  # oldest sample first
        self._window[0, tail:] = self._ring[: self._pos]
        copied = time.perf_counter()
        probabilities = self._model.predict(self._window)[0]
        inferred = time.perf_counter()
        detection = self._decide(probabilities)
        if self.timings is not None:
            self.timings.add(copied - start, inferred - copied, time.perf_counter() - inferred)
        return detection

    def _decide(self, probabilities: np.ndarray) -> Detection | None:
        """Smoothing, then a detection on a rising edge over the threshold, outside the refractory period."""
        self._history.append(probabilities)
        smoothed = np.sum(self._history, axis=0) / self.config.smoothing
        best = int(np.argmax(smoothed))
        if smoothed[best] < self.config.threshold:
            if len(self._history) == self.config.smoothing:  # not while a swap's history fills up again
                self._armed = True
            return None
        armed, self._armed = self._armed, False
        now = self.samples / self.sample_rate
        last = self._last_detection_s
        if not armed or (last is not None and now - last < self.config.refractory_s):
            return None
        self._last_detection_s = now
        return Detection(self._labels[best], float(smoothed[best]), now)
