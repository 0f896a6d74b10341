"""Torch-free edits of ONNX graphs."""

import onnx


def strip_debug_info(proto: onnx.ModelProto) -> None:
    """Drop what only a debugger reads: node names and stack traces, shape annotations.

    Over a fifth of a small model's file; onnxruntime needs none of it (it infers shapes itself).
    """
    for node in proto.graph.node:
        del node.metadata_props[:]
        node.name = node.doc_string = ""
    del proto.graph.value_info[:]
