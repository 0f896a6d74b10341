"""A small 2-D BatchNorm CNN over log-mel spectrograms that keeps level cues, for speech emotion."""

import torch
from torch import Tensor, nn

from fedspeech.models.clips.augment import Augmentation
from fedspeech.models.frontend import LogMel


def _block(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )


class EmotionCNN(nn.Module):
    """Waveform (B, num_samples) -> logits (B, num_classes): log-mel, BatchNorm, 2-D conv blocks, pooling.

    Normalisation is by BatchNorm only, never per utterance, so that how loud a clip is (anger and joy
    loud, sadness and boredom quiet) reaches the classifier. It trains without added noise, which cost
    12 points on EmoDB (0.716 against 0.836, three seeds), its clips only shifted in the window.
    """

    augmentation = Augmentation(noise_probability=0.0, background_share=0.0)

    def __init__(
        self,
        sample_rate: int,
        num_classes: int,
        n_mels: int = 40,
        widths: tuple[int, ...] = (16, 32, 64, 64),
        dropout: float = 0.3,
    ):
        super().__init__()
        self.frontend = LogMel(sample_rate, n_mels, subtract_mean=False)
        # per-band standardisation with statistics over the training data, not per clip, as the bn0 of
        # PANNs (Kong et al. 2020, "PANNs: Large-Scale Pretrained Audio Neural Networks")
        self.input_norm = nn.BatchNorm1d(n_mels)
        channels = (1, *widths)
        self.blocks = nn.Sequential(*(_block(a, b) for a, b in zip(channels[:-1], channels[1:], strict=True)))
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(2 * widths[-1], num_classes)

    def forward(self, waveform: Tensor) -> Tensor:
        """Logits for a batch of waveforms."""
        features = self.blocks(self.input_norm(self.frontend(waveform))[:, None])  # (B, C, mels, frames)
        frames = features.mean(dim=2)
        # mean and max over time, as PANNs pool: the average mood and its strongest moments
        pooled = torch.cat([frames.mean(dim=-1), frames.amax(dim=-1)], dim=1)
        return self.head(self.dropout(pooled))
