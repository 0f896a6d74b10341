"""int8 copies of an exported model with onnxruntime's quantisation tools; metadata kept, no torch."""

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

from fedspeech.export.graph import strip_debug_info
from fedspeech.protocol import onnx_metadata as meta

_WEIGHTED = ("Conv", "MatMul", "Gemm")


class _Clips:
    """onnxruntime's calibration reader: one waveform at a time."""

    def __init__(self, input_name: str, waveforms: np.ndarray):
        self._feeds: Iterator[dict[str, np.ndarray]] = (
            {input_name: np.ascontiguousarray(w[None], dtype=np.float32)} for w in waveforms
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def quantize(fp32: Path, out: Path, calibration: np.ndarray | None = None) -> Path:
    """Write an int8 copy of fp32 to out: static if calibration waveforms are given, else dynamic.

    Static is QDQ with per-tensor weight scales and activation ranges calibrated on the waveforms
    (per-channel scales made the FSDD CNN's file 0.301x the fp32 one instead of 0.295x); dynamic stores
    int8 weights and quantises activations on the fly. Static activations are uint8: onnxruntime's x86
    kernels fuse uint8-activation, int8-weight QDQ convolutions into QLinearConv, while int8 activations
    leave each one a dequantise, a float Conv and a quantise, slower than the fp32 model.
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    source = onnx.load(fp32)
    # Nodes are named for the quantiser's exclusion list (export strips names; they are dropped again).
    for i, node in enumerate(source.graph.node):
        node.name = f"n{i}"
    # Only trained weights are quantised. The front-end's DFT kernels and mel filters are computed in
    # the graph (no initializer): those products stay float, and so do the log and normalisations, whose
    # small values int8 activations would crush (accuracy fell to 0.47 on FSDD when they were included).
    weights = {init.name for init in source.graph.initializer}
    computed = [n.name for n in source.graph.node if n.op_type in _WEIGHTED and n.input[1] not in weights]
    options = {"op_types_to_quantize": list(_WEIGHTED), "nodes_to_exclude": computed}
    with tempfile.TemporaryDirectory() as tmp:
        named = Path(tmp) / "named.onnx"
        onnx.save_model(source, named)
        if calibration is None:
            quantize_dynamic(named, out, weight_type=QuantType.QInt8, **options)
        else:
            if len(calibration) == 0:
                raise ValueError("static quantisation needs at least one calibration clip")
            reader = _Clips(source.graph.input[0].name, calibration)
            quantize_static(
                named,
                out,
                reader,
                quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                **options,
            )
    quantized = onnx.load(out)
    strip_debug_info(quantized)
    metadata = {p.key: p.value for p in source.metadata_props} | {meta.QUANTIZATION: "int8"}
    del quantized.metadata_props[:]
    onnx.helper.set_model_props(quantized, metadata)
    onnx.save_model(quantized, out)
    return Path(out)
