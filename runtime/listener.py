"""The listener: a fedspeech model hearing a stream of audio, the one entry point of the runtime.

    listener = Listener("model.onnx", sample_rate=16000, on_detection=print)
    listener.feed(samples)  # any number of int16 or float samples at 16 kHz
    listener.flush()  # the stream ended: its last word is decided

Samples come in blocks of any size, as int16 (or its little-endian bytes) or float in [-1, 1], one channel
(or several, mixed down), at any rate: they are resampled to the model's rate as they come (soxr's
streaming resampler) and cut into the streaming detector's frames (streaming), and each detection is
returned by `feed` and given to on_detection as it is made. Following a coordinator (a ModelFollower, or
`Listener.following`), the newest model is swapped in between two frames, so no audio is lost; on_model
hears of the first model and of each swapped in. Several listeners may share one follower, each with a
detector of its own. No thread of its own: whoever owns the audio calls `feed`.
"""

import logging
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import DEFAULT_ROOT
from fedspeech.runtime.model_follower import ModelFollower
from fedspeech.runtime.session import OnnxModel, PairedModel, load_local
from fedspeech.runtime.streaming import Detection, DetectorConfig, StreamingDetector

log = logging.getLogger(__name__)

INT16_SCALE = 32768.0


class Listener:
    """A model (an ONNX file, a loaded model, or a coordinator's newest through a ModelFollower) listening to
    audio at sample_rate (None: the model's own) fed with `feed`; ModelError for a file that is no model,
    ValueError for settings the model cannot run with, TimeoutError if a follower has no model in wait_s.
    """

    def __init__(
        self,
        model: OnnxModel | ModelFollower | Path | str,
        sample_rate: int | None = None,
        *,
        config: DetectorConfig | None = None,
        on_detection: Callable[[Detection], None] | None = None,
        on_model: Callable[[OnnxModel], None] | None = None,
        timings: bool = False,
        wait_s: float | None = None,
    ) -> None:
        self._follower = model if isinstance(model, ModelFollower) else None
        self._owned: ModelFollower | None = None  # a follower this listener started, and stops at close
        first = _first_model(model, wait_s)
        self.sample_rate = first.sample_rate if sample_rate is None else _positive(sample_rate)
        self._config, self._timings = config or DetectorConfig(), timings
        self.on_detection, self.on_model = on_detection, on_model
        self._refused: OnnxModel | None = None  # a follower's model that does not fit the stream
        self._start(first)
        if on_model is not None:
            on_model(first)

    @classmethod
    def following(
        cls,
        coordinator_url: str,
        broker: BrokerSettings | None = None,
        *,
        topic_root: str = DEFAULT_ROOT,
        coordinator_key: str | None = None,
        state_dir: Path | None = None,
        wait_s: float | None = None,
        **options: Any,
    ) -> "Listener":
        """A listener on the coordinator's newest model, followed until `close`; options as for Listener."""
        follower = ModelFollower(
            coordinator_url, broker or BrokerSettings(), topic_root, coordinator_key, state_dir=state_dir
        )
        follower.start()
        try:
            listener = cls(follower, wait_s=wait_s, **options)
        except BaseException:
            follower.stop()
            raise
        listener._owned = follower
        return listener

    @property
    def model(self) -> OnnxModel:
        """The model listening now."""
        return self.detector.model

    @property
    def seconds(self) -> float:
        """Seconds of audio heard since the stream started."""
        return self.detector.samples / self.detector.sample_rate

    def feed(self, audio: np.ndarray | bytes) -> list[Detection]:
        """Hear the next samples of the stream; the detections they complete, in order."""
        samples = _as_float(audio)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples)
        return self._push(samples)

    def flush(self) -> list[Detection]:
        """End the stream: the resampler's last samples and a window of silence, so that a word at its very
        end is decided; the detections that makes. `reset` starts a new stream.
        """
        tail = np.zeros(0, np.float32)
        if self._resampler is not None:
            tail = self._resampler.resample_chunk(tail, last=True)
        size = self.detector.frame_size
        silence = self.detector.num_samples + (-(self._filled + len(tail))) % size
        return self._push(np.concatenate([tail, np.zeros(silence, np.float32)]))

    def reset(self, sample_rate: int | None = None) -> None:
        """Start a new stream (at sample_rate, else the last one's): a fresh detector on the newest model,
        its clock at 0, nothing buffered.
        """
        if sample_rate is not None:
            self.sample_rate = _positive(sample_rate)
        self._start(self._newest())

    def close(self) -> None:
        """Stop following the coordinator, if this listener started the follower."""
        if self._owned is not None:
            self._owned.stop()
            self._owned = None

    def __enter__(self) -> "Listener":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def describe(self) -> str:
        """One line: the model, how its windows are computed, the frames and the threshold."""
        detector = self.detector
        pair = ", its front-end on new frames only" if isinstance(detector.model, PairedModel) else ""
        return (
            f"{detector.model.describe()}{pair}: a window of {detector.num_samples} samples classified every "
            f"{detector.hop_frames} frames of {detector.frame_size} in speech, detection threshold "
            f"{detector.threshold:.2f} ({detector.threshold_origin})"
        )

    def _start(self, model: OnnxModel) -> None:
        """A new detector on model, and a new resampler from the input's rate to the model's."""
        self.detector = StreamingDetector(model, self._config, timings=self._timings)
        self._partial = np.zeros(self.detector.frame_size, np.float32)  # a frame not yet whole
        self._filled = 0
        self._resampler = None
        if self.sample_rate != model.sample_rate:
            import soxr

            self._resampler = soxr.ResampleStream(self.sample_rate, model.sample_rate, 1, dtype="float32")

    def _push(self, samples: np.ndarray) -> list[Detection]:
        """Cut samples at the model's rate into frames, after the partial frame left before; push them."""
        size, start = self.detector.frame_size, 0
        detections: list[Detection] = []
        if self._filled:
            start = min(size - self._filled, len(samples))
            self._partial[self._filled : self._filled + start] = samples[:start]
            self._filled += start
            if self._filled < size:
                return detections
            self._frame(self._partial, detections)
            self._filled = 0
        while start + size <= len(samples):
            self._frame(samples[start : start + size], detections)
            start += size
        self._filled = len(samples) - start
        self._partial[: self._filled] = samples[start:]
        return detections

    def _frame(self, frame: np.ndarray, detections: list[Detection]) -> None:
        """Swap in a newer model if the follower has one, then push one frame."""
        newest = self._newest()
        if newest is not self.detector.model and newest is not self._refused:
            self._swap_in(newest)
        detection = self.detector.push(frame)
        if detection is not None:
            detections.append(detection)
            if self.on_detection is not None:
                self.on_detection(detection)

    def _newest(self) -> OnnxModel:
        """The follower's newest model, else the one listening."""
        newest = None if self._follower is None else self._follower.model
        return newest or self.detector.model

    def _swap_in(self, model: OnnxModel) -> None:
        """Swap model in between two frames; keep the current one (logged once) if it does not fit."""
        try:
            self.detector.swap(model)
        except ValueError as exc:
            log.error("keeping %s: %s", self.detector.model.describe(), exc)
            self._refused = model
            return
        log.info("swapped in %s at %.2f s of audio", model.describe(), self.seconds)
        log.info("detection threshold %.2f (%s)", self.detector.threshold, self.detector.threshold_origin)
        if self.on_model is not None:
            self.on_model(model)


def _first_model(model: OnnxModel | ModelFollower | Path | str, wait_s: float | None) -> OnnxModel:
    """The model to start with: loaded from a file, given, or the follower's first (waited for)."""
    if isinstance(model, OnnxModel):
        return model
    if isinstance(model, ModelFollower):
        first = model.model or model.wait(wait_s)
        if first is None:
            raise TimeoutError(f"no model from the coordinator at {model.coordinator_url} yet")
        return first
    return load_local(Path(model))


def _positive(sample_rate: int) -> int:
    """sample_rate, ValueError unless it is positive."""
    if sample_rate <= 0:
        raise ValueError(f"the sample rate must be positive, not {sample_rate}")
    return sample_rate


def _as_float(audio: np.ndarray | bytes) -> np.ndarray:
    """Samples as float32 mono: int16 (or its little-endian bytes) scaled to [-1, 1), channels mixed down."""
    if isinstance(audio, bytes | bytearray | memoryview):
        if len(audio) % 2:
            raise ValueError(f"{len(audio)} bytes are not whole 16-bit samples")
        audio = np.frombuffer(audio, dtype="<i2")
    samples = np.asarray(audio)
    if samples.dtype == np.int16:
        samples = samples.astype(np.float32) / INT16_SCALE
    elif samples.dtype.kind == "f":
        samples = samples.astype(np.float32, copy=False)
    else:
        raise ValueError(f"expected int16 or float samples, got {samples.dtype}")
    if samples.ndim == 2:  # (samples, channels)
        samples = samples.mean(axis=1, dtype=np.float32)
    if samples.ndim != 1:
        raise ValueError(f"expected samples (n,) or (n, channels), got shape {samples.shape}")
    return samples
