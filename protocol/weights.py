"""Model weights on the wire and on disk: safetensors bytes with a sha256 digest, never pickle."""

import hashlib
import json
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import safetensors
import safetensors.numpy

from fedspeech.protocol.bounds import MAX_WEIGHTS_HEADER_BYTES

Arrays = dict[str, np.ndarray]
# the floating-point types weights travel in: float16 halves every download and upload
Precision = Literal["float32", "float16"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
HEADER_LENGTH_BYTES = 8  # a safetensors blob starts with its header's length: 8 bytes, little-endian


class WeightsError(ValueError):
    """Weights that cannot be used; the text says why."""


def sha256(data: bytes) -> str:
    """Hex sha256 digest of a blob."""
    return hashlib.sha256(data).hexdigest()


def encode(arrays: Arrays, metadata: dict[str, str] | None = None) -> bytes:
    """Serialise named arrays (and string metadata) to safetensors bytes, the same for the same input."""
    blob = safetensors.numpy.save({k: np.ascontiguousarray(v) for k, v in arrays.items()}, metadata=metadata)
    return _metadata_sorted(blob) if metadata and len(metadata) > 1 else blob


def _metadata_sorted(blob: bytes) -> bytes:
    """The blob with its metadata in sorted order.

    safetensors writes metadata in a hash map's order, a new one each time (its issue 584), so the same
    weights would be different bytes, and so have a different digest, from one save to the next.
    """
    length = int.from_bytes(blob[:HEADER_LENGTH_BYTES], "little")
    header = json.loads(blob[HEADER_LENGTH_BYTES : HEADER_LENGTH_BYTES + length])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors pads it
    return len(text).to_bytes(HEADER_LENGTH_BYTES, "little") + text + blob[HEADER_LENGTH_BYTES + length :]


def with_precision(arrays: Arrays, precision: str) -> Arrays:
    """The arrays with every floating-point one in precision (PRECISIONS); counters as they are."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    dtype = np.dtype(precision)
    return {k: v.astype(dtype) if v.dtype.kind == "f" and v.dtype != dtype else v for k, v in arrays.items()}


def check_header_length(start: bytes) -> None:
    """Raise WeightsError if a blob's first bytes announce a header longer than MAX_WEIGHTS_HEADER_BYTES.

    Cheap, so that a blob built to cost its parser seconds is refused before anything parses it.
    """
    length = int.from_bytes(start[:HEADER_LENGTH_BYTES], "little")
    if length > MAX_WEIGHTS_HEADER_BYTES:
        raise WeightsError(
            f"a safetensors header of {length} bytes; at most {MAX_WEIGHTS_HEADER_BYTES} are taken"
        )


def decode(data: bytes) -> tuple[Arrays, dict[str, str]]:
    """Parse safetensors bytes into arrays and metadata; raise WeightsError if malformed."""
    check_header_length(data)
    try:
        arrays = safetensors.numpy.load(data)
        header_len = int.from_bytes(data[:8], "little")
        metadata = json.loads(data[8 : 8 + header_len]).get("__metadata__") or {}
    except (safetensors.SafetensorError, ValueError, TypeError, KeyError) as exc:
        raise WeightsError(f"not a safetensors blob: {exc}") from None
    return arrays, metadata


def read_metadata(path: Path) -> dict[str, str]:
    """A safetensors file's string metadata, its header alone read; WeightsError if it is not one, OSError
    if it cannot be read.
    """
    with path.open("rb") as file:
        check_header_length(file.read(HEADER_LENGTH_BYTES))
    try:
        with safetensors.safe_open(str(path), framework="numpy") as opened:
            return dict(opened.metadata() or {})
    except (safetensors.SafetensorError, ValueError) as exc:
        raise WeightsError(f"not a safetensors file: {exc}") from None


def check_digest(data: bytes, expected: str) -> None:
    """Raise WeightsError unless the blob's sha256 is the expected one."""
    actual = sha256(data)
    if actual != expected.lower():
        raise WeightsError(f"sha256 mismatch: got {actual}, expected {expected}")


def check_like(arrays: Arrays, reference: Arrays) -> None:
    """Raise WeightsError unless arrays match the reference's names, shapes and dtypes and are finite."""
    missing = reference.keys() - arrays.keys()
    extra = arrays.keys() - reference.keys()
    if missing or extra:
        raise WeightsError(f"tensor names differ: missing {sorted(missing)}, unexpected {sorted(extra)}")
    for name, ref in reference.items():
        value = arrays[name]
        if value.shape != ref.shape:
            raise WeightsError(f"{name}: shape {value.shape}, expected {ref.shape}")
        if value.dtype != ref.dtype:
            raise WeightsError(f"{name}: dtype {value.dtype}, expected {ref.dtype}")
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise WeightsError(f"{name}: contains NaN or infinite values")
