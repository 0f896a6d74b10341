"""Where the streaming detector's windows come from: the one seam between a one-file model and a pair.

numpy only (the models run on onnxruntime). A window is the newest `num_samples` of the stream, which a
ring of samples holds, the sample at stream position a at ring index a % num_samples; windows end on the
detector's hops. With one file (`WaveformWindows`), the window's samples are copied oldest first and the
model runs on them, its front-end on the whole window. With a pair (`FeatureWindows`), a `FeatureRing`
keeps the raw log-mel frames of the last window on the stream's grid of frames (frame g reads the samples
from g * hop_samples on, the stream's start padded with silence as the ring is); the front-end runs only
on the samples of the frames the window has that the ring lacks (one hop's worth between two windows in a
row, a whole window after a silence), and the classifier on the window's frames. As every window starts on
that grid (the window and the hop are whole numbers of frames), its frames are exactly those the front-end
computes on the window itself, and the probabilities are the one file's.
"""

from collections.abc import Callable
from typing import Protocol

import numpy as np

from fedspeech.runtime.session import OnnxModel, PairedModel


class WindowSource(Protocol):
    """Makes a window's input from the ring of samples, then its class probabilities (1, num_classes)."""

    def window(self, ring: np.ndarray, end: int) -> np.ndarray:
        """The model's input for the window of the ring's newest samples, end the samples pushed so far."""
        ...

    def classify(self, window: np.ndarray) -> np.ndarray:
        """The class probabilities of a window's input."""
        ...


class WaveformWindows:
    """One file's windows: the ring's samples copied oldest first into a preallocated window."""

    def __init__(self, model: OnnxModel, num_samples: int):
        self._model = model
        self._window = np.zeros((1, num_samples), dtype=np.float32)

    def window(self, ring: np.ndarray, end: int) -> np.ndarray:
        """The window's samples, oldest first."""
        pos = end % len(ring)
        tail = len(ring) - pos
        self._window[0, :tail] = ring[pos:]
        self._window[0, tail:] = ring[:pos]
        return self._window

    def classify(self, window: np.ndarray) -> np.ndarray:
        """The model on the window's samples."""
        return self._model.predict(window)


class FeatureRing:
    """The raw log-mel frames of one window on the stream's grid, each computed once by `features`.

    features(samples) gives the frames (1, n_mels, k) of samples (1, (k - 1) * hop + fft): k frames, a hop
    apart. Pure numpy around it, preallocated: the samples it reads, the frames it keeps, the window it gives.
    """

    def __init__(
        self,
        features: Callable[[np.ndarray], np.ndarray],
        n_mels: int,
        frames: int,
        hop: int,
        fft: int,
        num_samples: int,
    ):
        if num_samples % hop or (frames - 1) * hop + fft > num_samples:
            raise ValueError(f"{frames} frames a hop of {hop} apart do not tile a window of {num_samples}")
        self._features, self.hop, self.fft, self.frames = features, hop, fft, frames
        self._frames = np.zeros((n_mels, frames), dtype=np.float32)  # frame g in column g % frames
        self._samples = np.zeros(num_samples, dtype=np.float32)  # the samples of the frames to compute
        self._window = np.zeros((1, n_mels, frames), dtype=np.float32)
        self._next: int | None = None  # the first frame not computed yet; None: none computed
        self.computed = 0  # frames computed so far (how much the front-end ran)

    def window(self, ring: np.ndarray, end: int) -> np.ndarray:
        """The frames (1, n_mels, frames) of the window of ring's newest samples, end the stream's samples
        so far (the window starts on the grid); only the frames not computed yet are.
        """
        start = end - len(ring)
        if start % self.hop:
            raise ValueError(f"a window starting at sample {start} is off the grid of {self.hop} samples")
        first = start // self.hop
        last = first + self.frames  # the window's frames are first ... last - 1
        new = first if self._next is None else min(max(self._next, first), last)
        if new < last:
            self._compute(ring, new, last)
        self._next = last
        self._copy_out(first)
        return self._window

    def _compute(self, ring: np.ndarray, first: int, last: int) -> None:
        """Run features on the samples of frames first ... last - 1 and keep the frames."""
        length = (last - first - 1) * self.hop + self.fft
        at = (first * self.hop) % len(ring)
        head = min(length, len(ring) - at)
        self._samples[:head] = ring[at : at + head]
        self._samples[head:length] = ring[: length - head]
        frames = self._features(self._samples[:length].reshape(1, length))[0]
        column = first % self.frames
        head = min(last - first, self.frames - column)
        self._frames[:, column : column + head] = frames[:, :head]
        self._frames[:, : last - first - head] = frames[:, head:]
        self.computed += last - first

    def _copy_out(self, first: int) -> None:
        """The window's frames, from frame first on, into the window, oldest first."""
        column = first % self.frames
        tail = self.frames - column
        self._window[0, :, :tail] = self._frames[:, column:]
        self._window[0, :, tail:] = self._frames[:, :column]


class FeatureWindows:
    """A pair's windows: the frames a FeatureRing keeps, the classifier run on them."""

    def __init__(self, model: PairedModel):
        self._model = model
        grid = (model.n_mels, model.frames, model.hop_samples, model.fft_samples, model.num_samples)
        self.ring = FeatureRing(model.features, *grid)

    def window(self, ring: np.ndarray, end: int) -> np.ndarray:
        """The window's raw log-mel frames, the front-end run on new frames only."""
        return self.ring.window(ring, end)

    def classify(self, window: np.ndarray) -> np.ndarray:
        """The classifier on the window's frames."""
        return self._model.classify(window)


def window_source(model: OnnxModel, hop_size: int) -> WindowSource:
    """The source of the windows of model, classified every hop_size samples: a pair's frames where its
    windows start on its grid of frames (the window and the hop are whole numbers of frames), else samples.
    """
    if isinstance(model, PairedModel) and _on_grid(model, hop_size):
        return FeatureWindows(model)
    return WaveformWindows(model, model.num_samples)


def _on_grid(model: PairedModel, hop_size: int) -> bool:
    """Whether the pair's windows, one every hop_size samples, all start on its grid of frames."""
    return not (model.num_samples % model.hop_samples or hop_size % model.hop_samples)
