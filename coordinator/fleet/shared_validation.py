"""Validation clips devices chose to share for quality-weighted aggregation: bounded, checked, per device.

A device shares only when its operator opts in (`fedspeech client --share-validation N`). The
coordinator takes at most max_clips clips a device, of the task's clip length, and keeps the latest
clips each device sent in <state>/validation/<device>.safetensors.
"""

import logging
import threading
from pathlib import Path

import numpy as np

from fedspeech.coordinator.refusals import BadUpload
from fedspeech.protocol import weights
from fedspeech.protocol.files import write_atomically

log = logging.getLogger(__name__)

HEADER_BYTES = 1024  # room for a safetensors header of two arrays


class SharedValidation:
    """The clips devices shared, as one validation set."""

    def __init__(self, folder: Path, max_clips: int, num_samples: int, num_classes: int) -> None:
        if max_clips < 1:
            raise ValueError("max_clips must be at least 1")
        self.folder, self.max_clips = folder, max_clips
        self.num_samples, self.num_classes = num_samples, num_classes
        self._lock = threading.Lock()
        self._clips: tuple[np.ndarray, np.ndarray] | None = None
        self._stale = True

    @property
    def max_body(self) -> int:
        """The largest upload that can hold max_clips clips."""
        return self.max_clips * (self.num_samples * 4 + 8) + HEADER_BYTES

    def receive(self, device_id: str, body: bytes) -> int:
        """Check a device's clips and keep them in place of any it shared before; BadUpload says why not."""
        try:
            arrays, _ = weights.decode(body)
        except weights.WeightsError as exc:
            raise BadUpload(str(exc)) from None
        waveforms, labels = arrays.get("waveforms"), arrays.get("labels")
        if waveforms is None or labels is None or len(arrays) != 2:
            raise BadUpload("shared validation clips are exactly the arrays 'waveforms' and 'labels'")
        count = len(labels)
        if waveforms.dtype != np.float32 or waveforms.shape != (count, self.num_samples):
            raise BadUpload(f"waveforms must be float32 of shape (clips, {self.num_samples})")
        if labels.dtype != np.int64 or labels.ndim != 1 or not 1 <= count <= self.max_clips:
            raise BadUpload(f"labels must be int64, 1 to {self.max_clips} of them")
        if ((labels < 0) | (labels >= self.num_classes)).any():
            raise BadUpload(f"labels must be class indices below {self.num_classes}")
        if not np.isfinite(waveforms).all() or np.abs(waveforms).max() > 1.0:
            raise BadUpload("waveforms must be finite audio samples within [-1, 1]")
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomically(self.folder / f"{device_id}.safetensors", body)
        with self._lock:
            self._stale = True
        log.info("%s shared %d validation clips", device_id, count)
        return count

    def clips(self) -> tuple[np.ndarray, np.ndarray] | None:
        """All shared clips as (waveforms, labels), None before any device shared some."""
        with self._lock:
            if self._stale:
                self._clips, self._stale = self._load(), False
            return self._clips

    def _load(self) -> tuple[np.ndarray, np.ndarray] | None:
        parts = []
        for path in sorted(self.folder.glob("*.safetensors")):
            try:
                arrays, _ = weights.decode(path.read_bytes())
                parts.append((arrays["waveforms"], arrays["labels"]))
            except (OSError, weights.WeightsError, KeyError) as exc:
                log.warning("ignoring shared validation clips %s: %s", path, exc)
        if not parts:
            return None
        return np.concatenate([w for w, _ in parts]), np.concatenate([y for _, y in parts])
