"""An exported fedspeech model run with onnxruntime: numpy and onnxruntime only, never torch."""

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from fedspeech.protocol import onnx_metadata as meta
from fedspeech.protocol.labels import is_word, spoken

log = logging.getLogger(__name__)

M = TypeVar("M")
PROBE_TOLERANCE = 1e-4  # the largest probability difference of a pair from its one file on a probe window


class ModelError(Exception):
    """A file or blob that is not a usable fedspeech model; the text says why, in one line."""


class OnnxModel:
    """An exported fedspeech model: waveforms (batch, num_samples) in, class probabilities out."""

    def __init__(self, source: Path | str | bytes, threads: int = 1):
        self._session, self._metadata = _session(source, threads)
        self._input_name = self._session.get_inputs()[0].name
        missing = [key for key in meta.REQUIRED if key not in self._metadata]
        if missing:
            raise ValueError(f"not a fedspeech model: metadata {missing} missing")

    @property
    def metadata(self) -> dict[str, str]:
        """All metadata embedded at export (keys in protocol.onnx_metadata)."""
        return dict(self._metadata)

    @property
    def labels(self) -> list[str]:
        """Class names, in the order of the probability columns."""
        return json.loads(self._metadata[meta.LABELS])

    @property
    def words(self) -> list[str]:
        """The labels that are words, the ones a listener detects (protocol.labels.is_word)."""
        return [label for label in self.labels if is_word(label)]

    def spoken(self, label: str) -> str:
        """How a label is said, from the task's `say` embedded at export, else from its name."""
        try:
            say = json.loads(self._metadata.get(meta.SAY, "{}"))
        except ValueError:
            say = {}
        return spoken(label, say if isinstance(say, dict) else {})

    @property
    def sample_rate(self) -> int:
        """Sample rate in Hz the model expects."""
        return int(self._metadata[meta.SAMPLE_RATE])

    @property
    def num_samples(self) -> int:
        """Waveform length in samples the model expects."""
        return int(self._metadata[meta.NUM_SAMPLES])

    def describe(self) -> str:
        """A short name for the model, e.g. 'model cnn round 3'."""
        return f"model {self._metadata.get(meta.MODEL, '?')} round {self._metadata.get(meta.ROUND, '?')}"

    def predict(self, waveforms: np.ndarray) -> np.ndarray:
        """Class probabilities (batch, num_classes) for float waveforms (batch, num_samples)."""
        waveforms = np.ascontiguousarray(waveforms, dtype=np.float32)
        if waveforms.ndim != 2 or waveforms.shape[1] != self.num_samples:
            raise ValueError(f"expected waveforms (batch, {self.num_samples}), got shape {waveforms.shape}")
        return self._session.run(None, {self._input_name: waveforms})[0]


class PairedModel(OnnxModel):
    """A model exported as two graphs: its log-mel front-end (waveform samples of any length of at least
    fft_samples -> raw log-mel frames, one every hop_samples) and its classifier (a window's raw frames ->
    probabilities). predict runs both on whole windows; a stream runs `features` on new frames only.

    The metadata, labels and threshold are the classifier's; ValueError unless the two graphs are the two
    parts of one model (protocol.onnx_metadata.SHARED) on one grid of frames.
    """

    def __init__(self, frontend: Path | str | bytes, classifier: Path | str | bytes, threads: int = 1):
        super().__init__(classifier, threads)
        self._frontend, frontend_metadata = _session(frontend, threads)
        for part, metadata in ((meta.FRONTEND, frontend_metadata), (meta.CLASSIFIER, self._metadata)):
            missing = [key for key in meta.PAIR_REQUIRED if key not in metadata]
            if missing or metadata[meta.PART] != part:
                raise ValueError(f"not a fedspeech {part} graph: metadata {missing or [meta.PART]} missing")
        differ = [k for k in (*meta.SHARED, *meta.PAIR_REQUIRED[1:]) if _differs(k, frontend_metadata, self)]
        if differ:
            raise ValueError(f"the front-end and the classifier are not one model's: {differ} differ")
        grid = (int(self._metadata[key]) for key in meta.PAIR_REQUIRED[1:])
        self.hop_samples, self.fft_samples, self.frames, self.n_mels = grid
        if not 0 < self.fft_samples <= self.num_samples or self.hop_samples <= 0:
            raise ValueError("the pair's frames do not fit its window")
        if self.frames != 1 + (self.num_samples - self.fft_samples) // self.hop_samples:
            raise ValueError(f"{self.frames} frames per window do not fit {self.num_samples} samples")
        self._frontend_input = self._frontend.get_inputs()[0].name

    def features(self, samples: np.ndarray) -> np.ndarray:
        """Raw log-mel frames (batch, n_mels, frames) of float32 samples (batch, at least fft_samples)."""
        return self._frontend.run(None, {self._frontend_input: samples})[0]

    def classify(self, frames: np.ndarray) -> np.ndarray:
        """Class probabilities (batch, num_classes) of windows' raw log-mel frames (batch, n_mels, frames)."""
        return self._session.run(None, {self._input_name: frames})[0]

    def predict(self, waveforms: np.ndarray) -> np.ndarray:
        """Class probabilities (batch, num_classes) for float waveforms (batch, num_samples): both graphs."""
        waveforms = np.ascontiguousarray(waveforms, dtype=np.float32)
        if waveforms.ndim != 2 or waveforms.shape[1] != self.num_samples:
            raise ValueError(f"expected waveforms (batch, {self.num_samples}), got shape {waveforms.shape}")
        return self.classify(self.features(waveforms))


def _session(source: Path | str | bytes, threads: int) -> tuple[Any, dict[str, str]]:
    """An onnxruntime session of an ONNX file or blob on threads, and the model's metadata."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    model = source if isinstance(source, bytes) else str(source)
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session, dict(session.get_modelmeta().custom_metadata_map)


def _differs(key: str, metadata: dict[str, str], model: OnnxModel) -> bool:
    """Whether a metadata entry differs between a graph's metadata and a model's."""
    return metadata.get(key) != model.metadata.get(key)


def load_model(source: Path | bytes, name: str | None = None) -> OnnxModel:
    """Load an ONNX file or blob as an OnnxModel; ModelError with name and the reason if it is not one."""
    name = name or str(source)
    if isinstance(source, Path) and not source.is_file():
        raise ModelError(f"{name}: no such model file")
    return _loaded(lambda: OnnxModel(source), name)


def load_pair(frontend: Path | bytes, classifier: Path | bytes, name: str) -> PairedModel:
    """Load a front-end and a classifier graph as a PairedModel; ModelError with name and the reason if
    they are not the two graphs of one fedspeech model.
    """
    for source in (frontend, classifier):
        if isinstance(source, Path) and not source.is_file():
            raise ModelError(f"{source}: no such model file")
    return _loaded(lambda: PairedModel(frontend, classifier), name)


def load_local(path: Path) -> OnnxModel:
    """A local model file: its pair (<stem>.frontend.onnx and <stem>.classifier.onnx beside it, as
    export_onnx(pair=True) writes them) when both are there and are the same model as the file (the same
    metadata and probabilities on a probe window), else the file alone; ModelError if it is not a model.
    """
    model = load_model(path)
    frontend, classifier = meta.pair_paths(path)
    if not (frontend.is_file() and classifier.is_file()):
        return model
    try:
        pair = load_pair(frontend, classifier, f"{frontend} and {classifier}")
        _check_same(model, pair)
    except (ModelError, ValueError) as exc:
        log.warning("using %s alone, not the two graphs beside it: %s", path, exc)
        return model
    return pair


def _check_same(model: OnnxModel, pair: PairedModel) -> None:
    """ValueError unless the pair is the same model as the one file: metadata, and probabilities on a
    probe window (deterministic noise, and silence) within PROBE_TOLERANCE.
    """
    differ = [key for key in meta.SHARED if _differs(key, pair.metadata, model)]
    if differ:
        raise ValueError(f"its metadata {differ} differ from the file's")
    probe = np.random.default_rng(0).standard_normal((2, model.num_samples)).astype(np.float32) * 0.1
    probe[1] = 0.0
    gap = float(np.max(np.abs(model.predict(probe) - pair.predict(probe))))
    if not gap <= PROBE_TOLERANCE:
        raise ValueError(f"its probabilities differ from the file's by {gap:.2g} on a probe window")


def _loaded(load: Callable[[], M], name: str) -> M:
    """What load returns; ModelError with name and the reason if it fails."""
    try:
        return load()
    except Exception as exc:  # onnxruntime's own errors (InvalidProtobuf, ...) derive only from Exception
        reason = " ".join(str(exc).split())
        raise ModelError(f"{name}: not a usable fedspeech ONNX model ({reason})") from None
