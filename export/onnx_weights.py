"""Replace the weights of an exported ONNX file with named arrays: onnx and numpy only, never torch."""

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from fedspeech.protocol import onnx_metadata as meta
from fedspeech.protocol.files import write_atomically

# export wraps the model as `.model`, so state-dict tensor "x.y" becomes the initializer "model.x.y"
PREFIX = "model."


def update_onnx_weights(
    template: Path,
    arrays: dict[str, np.ndarray],
    out: Path,
    *,
    round: int | None = None,
    task: str | None = None,
    threshold: float | None = None,
    threshold_from: str | None = None,
) -> Path:
    """Write to out a copy of an export_onnx file with the named weights replaced by arrays.

    The names are get_arrays names; any subset of them may be given, the other weights stay as they are.
    round, task and threshold, if given, replace the template's; threshold_from, if given, replaces the
    template's threshold and where it came from (a threshold of None then removes the template's).
    """
    proto = onnx.load_model(template)
    initializers = {init.name: init for init in proto.graph.initializer}
    missing = sorted(name for name in arrays if PREFIX + name not in initializers)
    if missing:
        raise ValueError(f"{template}: no initializers for {missing}; export the model afresh")
    for name, value in arrays.items():
        init = initializers[PREFIX + name]
        old = numpy_helper.to_array(init)
        if value.shape != old.shape or value.dtype != old.dtype:
            raise ValueError(f"{name}: {value.dtype}{value.shape}, the graph has {old.dtype}{old.shape}")
        init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(value), init.name))
    metadata = {prop.key: prop.value for prop in proto.metadata_props}
    if round is not None:
        metadata[meta.ROUND] = str(round)
    if task is not None:
        metadata[meta.TASK] = task
    if threshold_from is not None:
        metadata.pop(meta.THRESHOLD, None)
    metadata |= threshold_metadata(threshold, threshold_from)
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, metadata)
    return _save_atomically(proto, out)


def threshold_metadata(threshold: float | None, threshold_from: str | None = None) -> dict[str, str]:
    """The metadata entries of a calibrated detection threshold (none for None) and where it came from (if
    given); ValueError if the threshold is not in (0, 1].
    """
    entries = {meta.THRESHOLD_FROM: threshold_from} if threshold_from is not None else {}
    if threshold is None:
        return entries
    if not 0 < threshold <= 1:
        raise ValueError(f"a detection threshold is a probability in (0, 1], not {threshold}")
    return {meta.THRESHOLD: f"{threshold:.4f}"} | entries


def _save_atomically(proto: onnx.ModelProto, path: Path) -> Path:
    """Write proto to path whole or not at all."""
    write_atomically(Path(path), proto.SerializeToString())
    return Path(path)
