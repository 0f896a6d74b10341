"""The audio front-end: waveform to per-utterance normalised log-mel spectrogram, in torch."""

import math

import numpy as np
import torch
from torch import nn


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Triangular HTK-scale mel filters as an (n_mels, n_fft // 2 + 1) float32 matrix."""

    def hz_to_mel(hz: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + hz / 700.0)

    def mel_to_hz(mel: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)

    bin_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(np.array(0.0)), hz_to_mel(np.array(sample_rate / 2)), n_mels + 2))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bin_hz - lower) / (centre - lower)
    falling = (upper - bin_hz) / (upper - centre)
    return np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)


class LogMel(nn.Module):
    """Waveform (B, T) -> log-mel (B, n_mels, frames), mean-subtracted over time per utterance."""

    def __init__(self, sample_rate: int, n_mels: int = 40, window_ms: float = 25.0, hop_ms: float = 10.0):
        super().__init__()
        self.win_length = int(sample_rate * window_ms / 1000)
        self.hop_length = int(sample_rate * hop_ms / 1000)
        self.n_fft = 2 ** math.ceil(math.log2(self.win_length))
        # zero-padded to n_fft here (as torch.stft would) so the exported graph does not pad it at run time
        left = (self.n_fft - self.win_length) // 2
        right = self.n_fft - self.win_length - left
        window = nn.functional.pad(torch.hann_window(self.win_length), (left, right))
        # not persistent: derived from the spec, so they stay out of the state dict and the wire
        self.register_buffer("window", window, persistent=False)
        mel = torch.from_numpy(mel_filterbank(sample_rate, self.n_fft, n_mels))
        self.register_buffer("mel", mel, persistent=False)

    def num_frames(self, num_samples: int) -> int:
        """Number of frames this front-end makes from num_samples samples."""
        return 1 + (num_samples - self.n_fft) // self.hop_length

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(
            waveform,
            n_fft=self.n_fft,
            hop_length=self.hop_length,
            window=self.window,
            center=False,
            return_complex=True,
        )
        power = spec.real.square() + spec.imag.square()
        # The floor sits below quiet speech (median mel power on FSDD ~3e-3) but keeps the zero padding of
        # short clips from dominating the features at log(1e-6).
        logmel = torch.log(torch.matmul(self.mel, power) + 1e-4)
        # per-utterance mean removal: a crude channel/speaker normalisation (like CMN)
        return logmel - logmel.mean(dim=-1, keepdim=True)
