"""Changed copies of ONNX model files."""

from pathlib import Path


def with_metadata(source: Path, out: Path, labels: list[str] | None = None, **changes: str | None) -> Path:
    """A copy of an ONNX file with some metadata changed (None: removed): same graph, same weights."""
    import json

    import onnx

    proto = onnx.load(source)
    metadata = {prop.key: prop.value for prop in proto.metadata_props} | changes
    if labels is not None:
        metadata["labels"] = json.dumps(labels)
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, {key: value for key, value in metadata.items() if value is not None})
    onnx.save(proto, out)
    return out
