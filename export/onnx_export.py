"""Export a trained model to ONNX (probabilities out, metadata in), as one graph or as two (its log-mel
front-end and its classifier); refresh its weights, check parity.
"""

import copy
import json
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir
import onnxscript.optimizer
import torch
from torch import nn

from fedspeech.export.graph import strip_debug_info
from fedspeech.export.onnx_weights import PREFIX, _save_atomically, threshold_metadata, update_onnx_weights
from fedspeech.models.frontend import LogMel
from fedspeech.models.train import TORCH_TRACING
from fedspeech.protocol import onnx_metadata as meta
from fedspeech.protocol.messages import ModelSpec

__all__ = [
    "PREFIX",
    "Parity",
    "export_classifier",
    "export_frontend",
    "export_onnx",
    "parity",
    "update_onnx_weights",
]

MAX_FRONTEND_SAMPLES = 2**24  # the longest waveform the front-end graph is exported for


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
    say: Mapping[str, str] | None = None,
    threshold: float | None = None,
    pair: bool = False,
) -> Path:
    """Export model to path as ONNX: input 'waveform' (batch, num_samples), output 'probabilities'.

    threshold, if given, is the model's calibrated detection threshold (models.calibration). pair: also
    write the model's two graphs beside it (onnx_metadata.pair_paths), which `fedspeech listen` takes.
    """
    metadata = _metadata(spec, labels, round, task, say) | threshold_metadata(threshold)
    with _evaluating(model):
        program = _export_graph(_Probabilities(model), torch.zeros(2, spec.num_samples), "waveform")
    _save(program, {PREFIX + name for name in model.state_dict()}, metadata, path)
    if pair:
        frontend_path, classifier_path = meta.pair_paths(path)
        export_frontend(
            model, spec, labels, frontend_path, round=round, task=task, say=say, threshold=threshold
        )
        export_classifier(
            model, spec, labels, classifier_path, round=round, task=task, say=say, threshold=threshold
        )
    return Path(path)


def export_frontend(
    model: nn.Module,
    spec: ModelSpec,
    labels: Sequence[str],
    path: Path,
    *,
    round: int | None = None,
    task: str = "",
    say: Mapping[str, str] | None = None,
    threshold: float | None = None,
) -> Path:
    """Export the model's log-mel front-end to path: input 'waveform' (batch, samples) of any length of at
    least one FFT window, output the raw log-mel 'frames' (batch, n_mels, frames), not mean-subtracted.

    It has no weights; it carries the one file's metadata and the pair's (onnx_metadata.PAIR_REQUIRED).
    """
    frontend = copy.deepcopy(_logmel(model))
    frontend.subtract_mean = False
    metadata = _metadata(spec, labels, round, task, say) | threshold_metadata(threshold)
    metadata |= _pair_metadata(frontend, spec, meta.FRONTEND)
    samples = torch.export.Dim("samples", min=frontend.n_fft, max=MAX_FRONTEND_SAMPLES)
    example = torch.zeros(2, spec.num_samples)
    program = _export_graph(frontend.eval(), example, "waveform", {1: samples}, output="frames")
    _save(program, set(), metadata, path)
    return Path(path)


def export_classifier(
    model: nn.Module,
    spec: ModelSpec,
    labels: Sequence[str],
    path: Path,
    *,
    round: int | None = None,
    task: str = "",
    say: Mapping[str, str] | None = None,
    threshold: float | None = None,
) -> Path:
    """Export the model but its front-end's log-mel to path: input a window's raw log-mel 'frames' (batch,
    n_mels, frames per window), output 'probabilities', equal to the one file's on the same window.

    The model's front-end is swapped for its normalisation alone (the mean over the window's frames
    subtracted, if the front-end does) while exporting; the weights keep the one file's names, so
    update_onnx_weights refreshes this graph as it does the one file.
    """
    logmel = _logmel(model)
    metadata = _metadata(spec, labels, round, task, say) | threshold_metadata(threshold)
    metadata |= _pair_metadata(logmel, spec, meta.CLASSIFIER)
    frames = torch.zeros(2, logmel.n_mels, logmel.num_frames(spec.num_samples))
    model.frontend = _Normalise(logmel.subtract_mean)
    try:
        with _evaluating(model):
            program = _export_graph(_Probabilities(model), frames, "frames")
    finally:
        model.frontend = logmel
    _save(program, {PREFIX + name for name in model.state_dict()}, metadata, path)
    return Path(path)


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


class _Normalise(nn.Module):
    """What a LogMel does after its log: the mean over time subtracted per band, if it subtracts it."""

    def __init__(self, subtract_mean: bool):
        super().__init__()
        self.subtract_mean = subtract_mean

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return frames - frames.mean(dim=-1, keepdim=True) if self.subtract_mean else frames


def _logmel(model: nn.Module) -> LogMel:
    """The model's front-end; ValueError for a model without a LogMel `frontend` (it cannot be split)."""
    frontend = getattr(model, "frontend", None)
    if not isinstance(frontend, LogMel):
        raise ValueError(f"{type(model).__name__} has no LogMel frontend: it cannot be split in two graphs")
    return frontend


def _pair_metadata(logmel: LogMel, spec: ModelSpec, part: str) -> dict[str, str]:
    """The metadata a graph of a pair carries besides the one file's: which it is, and the frames' grid."""
    return {
        meta.PART: part,
        meta.HOP_SAMPLES: str(logmel.hop_length),
        meta.FFT_SAMPLES: str(logmel.n_fft),
        meta.FRAMES: str(logmel.num_frames(spec.num_samples)),
        meta.N_MELS: str(logmel.n_mels),
    }


@contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """The model in eval mode for the duration, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _export_graph(
    module: nn.Module,
    example: torch.Tensor,
    input_name: str,
    dynamic: dict[int, Any] | None = None,
    output: str = "probabilities",
) -> Any:
    """The ONNX program of module on inputs like example (dimension 0 the batch, and dynamic's)."""
    with TORCH_TRACING, _quiet_exporter():
        program = torch.onnx.export(
            module,
            (example,),
            dynamo=True,
            input_names=[input_name],
            output_names=[output],
            dynamic_shapes=({0: torch.export.Dim("batch")} | (dynamic or {}),),
            # the full optimiser fuses layers and merges equal initializers, breaking the one-to-one
            # weight names update_onnx_weights relies on; only constants are folded (_save)
            optimize=False,
            verbose=False,
        )
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")
    return program


def _save(program: Any, weight_names: set[str], metadata: dict[str, str], path: Path) -> None:
    """Fold the program's constants (never its weights), strip it, set its metadata, write it to path."""
    _fold_constants(program.model, weight_names)
    proto = program.model_proto
    strip_debug_info(proto)
    onnx.helper.set_model_props(proto, metadata)
    _save_atomically(proto, path)


def _metadata(
    spec: ModelSpec, labels: Sequence[str], round: int | None, task: str, say: Mapping[str, str] | None
) -> dict[str, str]:
    if len(labels) != spec.num_classes:
        raise ValueError(f"{len(labels)} labels for a model with {spec.num_classes} classes")
    metadata = {
        meta.MODEL: spec.name,
        meta.LABELS: json.dumps(list(labels)),
        meta.SAMPLE_RATE: str(spec.sample_rate),
        meta.NUM_SAMPLES: str(spec.num_samples),
        meta.TASK: task,
    }
    if say:
        metadata[meta.SAY] = json.dumps({label: say[label] for label in labels if label in say})
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
