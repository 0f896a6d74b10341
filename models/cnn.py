"""A compact 1-D CNN over log-mel frames for keyword / digit / emotion classification."""

from torch import Tensor, nn

from fedspeech.models.frontend import LogMel


def _block(in_channels: int, out_channels: int, kernel_size: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False),
        nn.GroupNorm(out_channels, out_channels),  # per-channel, per-utterance: no batch statistics
        nn.ReLU(),
    )


class SpeechCNN(nn.Module):
    """Waveform (B, num_samples) -> logits (B, num_classes): log-mel, conv blocks, pooling, linear."""

    def __init__(self, sample_rate: int, num_classes: int, n_mels: int = 40, width: int = 64):
        super().__init__()
        self.frontend = LogMel(sample_rate, n_mels)
        self.features = nn.Sequential(
            nn.GroupNorm(1, n_mels),  # standardises each utterance's log-mel
            _block(n_mels, width, 5),
            nn.MaxPool1d(2),
            _block(width, width + width // 2, 5),
            nn.MaxPool1d(2),
            _block(width + width // 2, 2 * width, 3),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, waveform: Tensor) -> Tensor:
        return self.head(self.features(self.frontend(waveform)))
