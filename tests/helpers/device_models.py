"""Small models and their ONNX graphs for the device-side methods' tests: a teacher, norm layers, uploads."""

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from fedspeech.protocol import weights
from fedspeech.protocol.messages import (
    BlobRef,
    ModelSpec,
)
from fedspeech.protocol.weights import Arrays

SPEC = ModelSpec("cnn_bn", sample_rate=8000, num_samples=2000, num_classes=10)


TEACHER = BlobRef("/api/models/0/teacher", "0" * 64, 1)


def fresh(spec: ModelSpec = SPEC, seed: int = 0) -> Arrays:
    import torch

    from fedspeech.models import build_model
    from fedspeech.models.train import get_arrays

    torch.manual_seed(seed)
    return get_arrays(build_model(spec))


def names_of_norm(spec: ModelSpec = SPEC) -> set[str]:
    from fedspeech.models import build_model
    from fedspeech.models.norm import norm_names

    return norm_names(build_model(spec))


def uploaded(body: bytes) -> tuple[Arrays, dict[str, str]]:
    return weights.decode(body)


def initializers(path: Path) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in onnx.load_model(path).graph.initializer}
