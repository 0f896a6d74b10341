"""Growing a model: new encoder blocks added to trained ones."""

import re

import torch

from fedspeech.models import build_model
from fedspeech.models.architectures import NEW_BLOCKS
from fedspeech.models.train import get_arrays
from fedspeech.protocol.messages import ModelSpec
from fedspeech.protocol.weights import Arrays

_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")
_OUTPUTS = ("out.", "ff2.")  # a block's output projections: zero in a new block, whatever else it takes


def grow(arrays: Arrays, spec: ModelSpec, seed: int, new_blocks: str = "fresh") -> Arrays:
    """The arrays of a model of spec: every given array kept, the new blocks initialised (seeded).

    New blocks start with zero output projections, so with pre-LayerNorm the grown model computes
    exactly what the given one did. "copied" starts every other weight of a new block from the deepest
    trained block, as progressive stacking does (Gong et al., "Efficient Training of BERT by
    Progressively Stacking"), so its attention and feed-forward features are trained ones from its
    first step; "fresh" draws them at random.
    """
    if new_blocks not in NEW_BLOCKS:
        raise ValueError(f"new blocks start {NEW_BLOCKS}, not {new_blocks!r}")
    torch.manual_seed(seed)
    fresh = get_arrays(build_model(spec))
    unknown = sorted(arrays.keys() - fresh.keys())
    if unknown:
        raise ValueError(f"cannot grow into {spec}: it has no {unknown[:3]}")
    for name, value in arrays.items():
        if value.shape != fresh[name].shape:
            raise ValueError(f"{name}: shape {value.shape} does not fit {fresh[name].shape}")
    trained = [int(m[1]) for name in arrays if (m := _BLOCK.fullmatch(name))]
    top = max(trained, default=None)
    grown = {}
    for name, value in fresh.items():
        if name in arrays:
            grown[name] = arrays[name]
            continue
        block = _BLOCK.fullmatch(name)
        if new_blocks == "copied" and top is not None and block and not block[2].startswith(_OUTPUTS):
            grown[name] = arrays[f"blocks.{top}.{block[2]}"].copy()
        else:
            grown[name] = value
    return grown
