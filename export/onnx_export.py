"""Export a trained model to ONNX (probabilities out, metadata in), refresh its weights, check parity."""

import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir
import onnxscript.optimizer
import torch
from torch import nn

from fedspeech.export.graph import strip_debug_info
from fedspeech.export.onnx_weights import PREFIX, _save_atomically, threshold_metadata, update_onnx_weights
from fedspeech.protocol import onnx_metadata as meta
from fedspeech.protocol.messages import ModelSpec

__all__ = ["PREFIX", "Parity", "export_onnx", "parity", "update_onnx_weights"]


class _Probabilities(nn.Module):
    """The model followed by a softmax: what devices consume."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.model(waveform), dim=-1)


@dataclass
class Parity:
    """How closely onnxruntime reproduces torch: largest probability difference and argmax agreement."""

    max_abs_diff: float
    agreement: float


def export_onnx(
    model: nn.Module,
    spec: ModelSpec,
    labels: Sequence[str],
    path: Path,
    *,
    round: int | None = None,
    task: str = "",
    threshold: float | None = None,
) -> Path:
    """Export model to path as ONNX: input 'waveform' (batch, num_samples), output 'probabilities'.

    threshold, if given, is the model's calibrated detection threshold (models.calibration).
    """
    metadata = _metadata(spec, labels, round, task) | threshold_metadata(threshold)
    was_training = model.training
    model.eval()
    try:
        with _quiet_exporter():
            program = torch.onnx.export(
                _Probabilities(model),
                (torch.zeros(2, spec.num_samples),),
                dynamo=True,
                input_names=["waveform"],
                output_names=["probabilities"],
                dynamic_shapes=({0: torch.export.Dim("batch")},),
                # the full optimiser fuses layers and merges equal initializers, breaking the one-to-one
                # weight names update_onnx_weights relies on; only constants are folded (below)
                optimize=False,
                verbose=False,
            )
    finally:
        model.train(was_training)
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")
    _fold_constants(program.model, {PREFIX + name for name in model.state_dict()})
    proto = program.model_proto
    strip_debug_info(proto)
    onnx.helper.set_model_props(proto, metadata)
    return _save_atomically(proto, path)


def parity(model: nn.Module, onnx_path: Path, waveforms: np.ndarray) -> Parity:
    """Compare the model's torch probabilities with onnxruntime's for the exported file on waveforms."""
    waveforms = np.ascontiguousarray(waveforms, dtype=np.float32)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        expected = torch.softmax(model(torch.from_numpy(waveforms)), dim=-1).numpy()
    model.train(was_training)
    actual = _run_onnx(onnx_path, waveforms)
    return Parity(
        max_abs_diff=float(np.max(np.abs(expected - actual))),
        agreement=float(np.mean(expected.argmax(axis=1) == actual.argmax(axis=1))),
    )


def _metadata(spec: ModelSpec, labels: Sequence[str], round: int | None, task: str) -> dict[str, str]:
    if len(labels) != spec.num_classes:
        raise ValueError(f"{len(labels)} labels for a model with {spec.num_classes} classes")
    metadata = {
        meta.MODEL: spec.name,
        meta.LABELS: json.dumps(list(labels)),
        meta.SAMPLE_RATE: str(spec.sample_rate),
        meta.NUM_SAMPLES: str(spec.num_samples),
        meta.TASK: task,
    }
    if spec.depth is not None:
        metadata[meta.DEPTH] = str(spec.depth)
    if round is not None:
        metadata[meta.ROUND] = str(round)
    return metadata


def _run_onnx(path: Path, waveforms: np.ndarray) -> np.ndarray:
    """The exported file's output on waveforms, run as devices run it: onnxruntime on one thread."""
    # onnxruntime directly, not the device's OnnxModel: export must not import edge_client
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: waveforms})[0]


@contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's warnings (deprecations, absent torchvision) for the duration."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _fold_constants(graph_model: onnx_ir.Model, weight_names: set[str]) -> None:
    """Precompute constant subgraphs (window padding, casts) but never fold a node that reads a weight."""

    def should_fold(node: onnx_ir.Node) -> bool | None:
        reads_weight = any(value is not None and value.name in weight_names for value in node.inputs)
        return False if reads_weight else None  # None: let the folder decide

    # Large constants (the front-end's DFT kernels and mel filters) stay as the operators that compute
    # them: onnxruntime folds those when it loads the model, and the file stays small.
    onnxscript.optimizer.fold_constants(graph_model, should_fold=should_fold, output_size_limit=64)
    onnxscript.optimizer.remove_unused_nodes(graph_model)
