"""Inference with an exported model through onnxruntime; numpy and onnxruntime only, never torch."""

import json
from pathlib import Path

import numpy as np

REQUIRED_METADATA = ("labels", "sample_rate", "num_samples")


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
        missing = [key for key in REQUIRED_METADATA if key not in self._metadata]
        if missing:
            raise ValueError(f"not a fedspeech model: metadata {missing} missing")

    @property
    def metadata(self) -> dict[str, str]:
        """All metadata embedded at export: labels, sample_rate, num_samples, task, round, model."""
        return dict(self._metadata)

    @property
    def labels(self) -> list[str]:
        """Class names, in the order of the probability columns."""
        return json.loads(self._metadata["labels"])

    @property
    def sample_rate(self) -> int:
        """Sample rate in Hz the model expects."""
        return int(self._metadata["sample_rate"])

    @property
    def num_samples(self) -> int:
        """Waveform length in samples the model expects."""
        return int(self._metadata["num_samples"])

    def predict(self, waveforms: np.ndarray) -> np.ndarray:
        """Class probabilities (batch, num_classes) for float waveforms (batch, num_samples)."""
        waveforms = np.ascontiguousarray(waveforms, dtype=np.float32)
        if waveforms.ndim != 2 or waveforms.shape[1] != self.num_samples:
            raise ValueError(f"expected waveforms (batch, {self.num_samples}), got shape {waveforms.shape}")
        return self._session.run(None, {self._input_name: waveforms})[0]
