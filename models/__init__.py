"""PyTorch side of fedspeech: architectures, audio front-end and the local training step.

The torch-free code of the clips trained on (tasks, corpora, folders, augmentation) is in the subpackage
`clips`; scores and threshold calibration are numpy only too.
"""

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from fedspeech.models.architectures import MAX_DEPTH, MODELS, TRANSFORMERS
from fedspeech.protocol.messages import ModelSpec

if TYPE_CHECKING:  # torch is imported only by the modules that build or train models
    from torch import nn


__all__ = ["MAX_DEPTH", "MODELS", "TRANSFORMERS", "build_model", "depth_of"]

_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def depth_of(names: Iterable[str]) -> int:
    """How many encoder blocks a model's tensor names hold (0 for a model without blocks)."""
    indices = {int(m.group(1)) for name in names if (m := _BLOCK.match(name))}
    return max(indices) + 1 if indices else 0


def build_model(spec: ModelSpec) -> "nn.Module":
    """Build a freshly initialised model for a spec; ValueError for an unknown architecture."""
    if spec.name in ("cnn", "cnn_bn"):
        from fedspeech.models.cnn import SpeechCNN

        return SpeechCNN(
            spec.sample_rate, spec.num_classes, norm="batch" if spec.name == "cnn_bn" else "group"
        )
    if spec.name == "emotion_cnn":
        from fedspeech.models.emotion_cnn import EmotionCNN

        return EmotionCNN(spec.sample_rate, spec.num_classes)
    if spec.name in TRANSFORMERS:
        from fedspeech.models.transformer import SpeechTransformer

        pre_norm, scaled = TRANSFORMERS[spec.name]
        depth = MAX_DEPTH if spec.depth is None else spec.depth
        return SpeechTransformer(
            spec.sample_rate, spec.num_samples, spec.num_classes, depth, pre_norm=pre_norm, scaled=scaled
        )
    raise ValueError(f"unknown model {spec.name!r}, expected one of {MODELS}")
