"""An exported fedspeech model run with onnxruntime: numpy and onnxruntime only, never torch."""

import json
from pathlib import Path

import numpy as np

from fedspeech.protocol import onnx_metadata as meta


class ModelError(Exception):
    """A file or blob that is not a usable fedspeech model; the text says why, in one line."""


class OnnxModel:
    """An exported fedspeech model: waveforms (batch, num_samples) in, class probabilities out."""

    def __init__(self, source: Path | str | bytes, threads: int = 1):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        model = source if isinstance(source, bytes) else str(source)
        self._session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self._input_name = self._session.get_inputs()[0].name
        self._metadata = dict(self._session.get_modelmeta().custom_metadata_map)
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


def load_model(source: Path | bytes, name: str | None = None) -> OnnxModel:
    """Load an ONNX file or blob as an OnnxModel; ModelError with name and the reason if it is not one."""
    name = name or str(source)
    if isinstance(source, Path) and not source.is_file():
        raise ModelError(f"{name}: no such model file")
    try:
        return OnnxModel(source)
    except Exception as exc:  # onnxruntime's own errors (InvalidProtobuf, ...) derive only from Exception
        reason = " ".join(str(exc).split())
        raise ModelError(f"{name}: not a usable fedspeech ONNX model ({reason})") from None
