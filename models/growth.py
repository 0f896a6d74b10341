"""Growing a model: new encoder blocks added to trained ones."""

import torch

from fedspeech.models import build_model
from fedspeech.models.train import get_arrays
from fedspeech.protocol.messages import ModelSpec
from fedspeech.protocol.weights import Arrays


def grow(arrays: Arrays, spec: ModelSpec, seed: int) -> Arrays:
    """The arrays of a model of spec: every given array kept, the new blocks freshly initialised (seeded).

    New blocks start with zero output projections, so with pre-LayerNorm the grown model computes
    exactly what the given one did.
    """
    torch.manual_seed(seed)
    fresh = get_arrays(build_model(spec))
    unknown = sorted(arrays.keys() - fresh.keys())
    if unknown:
        raise ValueError(f"cannot grow into {spec}: it has no {unknown[:3]}")
    for name, value in arrays.items():
        if value.shape != fresh[name].shape:
            raise ValueError(f"{name}: shape {value.shape} does not fit {fresh[name].shape}")
    return {name: arrays.get(name, value) for name, value in fresh.items()}
