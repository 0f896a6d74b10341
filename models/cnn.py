"""A compact 1-D CNN over log-mel frames for keyword / digit / emotion classification."""

from typing import Literal

from torch import Tensor, nn

from fedspeech.models.frontend import LogMel

Norm = Literal["group", "batch"]


def _norm(channels: int, norm: Norm) -> nn.Module:
    if norm == "group":
        return nn.GroupNorm(channels, channels)  # per-channel, per-utterance: no batch statistics
    if norm == "batch":
        return nn.BatchNorm1d(channels)  # batch statistics, kept local by FedBN (Li et al. 2021)
    raise ValueError(f"unknown norm {norm!r}, expected 'group' or 'batch'")


def _block(in_channels: int, out_channels: int, kernel_size: int, norm: Norm) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False),
        _norm(out_channels, norm),
        nn.ReLU(),
    )


class SpeechCNN(nn.Module):
    """Waveform (B, num_samples) -> logits (B, num_classes): log-mel, conv blocks, pooling, linear.

    norm chooses the conv blocks' normalisation: "group" (per utterance) or "batch" (BatchNorm).
    """

    def __init__(
        self, sample_rate: int, num_classes: int, n_mels: int = 40, width: int = 64, norm: Norm = "group"
    ):
        super().__init__()
        self.frontend = LogMel(sample_rate, n_mels)
        self.features = nn.Sequential(
            nn.GroupNorm(1, n_mels),  # standardises each utterance's log-mel, whatever the blocks use
            _block(n_mels, width, 5, norm),
            nn.MaxPool1d(2),
            _block(width, width + width // 2, 5, norm),
            nn.MaxPool1d(2),
            _block(width + width // 2, 2 * width, 3, norm),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, waveform: Tensor) -> Tensor:
        return self.head(self.features(self.frontend(waveform)))
