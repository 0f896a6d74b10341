"""PyTorch side of fedspeech: architectures, audio front-end, datasets and the local training step."""

from typing import TYPE_CHECKING

from fedspeech.protocol.messages import ModelSpec

if TYPE_CHECKING:  # torch is imported only by the modules that build or train models
    from torch import nn


def build_model(spec: ModelSpec) -> "nn.Module":
    """Build a freshly initialised model for a spec; ValueError for an unknown architecture."""
    if spec.name == "cnn":
        from fedspeech.models.cnn import SpeechCNN

        return SpeechCNN(spec.sample_rate, spec.num_classes)
    raise ValueError(f"unknown model {spec.name!r}, expected one of ['cnn']")
