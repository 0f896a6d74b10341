"""The audio front-end: waveform to per-utterance normalised log-mel spectrogram, in torch."""

import math

import torch
from torch import nn


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int) -> torch.Tensor:
    """Triangular HTK-scale mel filters as an (n_mels, n_fft // 2 + 1) float32 matrix."""
    bin_hz = torch.arange(n_fft // 2 + 1, dtype=torch.float32) * (sample_rate / n_fft)
    top_mel = 2595.0 * math.log10(1.0 + sample_rate / 2 / 700.0)
    edges_mel = torch.arange(n_mels + 2, dtype=torch.float32) * (top_mel / (n_mels + 1))
    edges = 700.0 * (torch.pow(10.0, edges_mel / 2595.0) - 1.0)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bin_hz - lower) / (centre - lower)
    falling = (upper - bin_hz) / (upper - centre)
    return torch.clamp(torch.minimum(rising, falling), min=0.0)


def dft_kernels(n_fft: int, win_length: int) -> torch.Tensor:
    """Hann-windowed cosine and sine kernels (2 * (n_fft // 2 + 1), 1, win_length) of a centred window."""
    left = (n_fft - win_length) // 2
    frequency = torch.arange(n_fft // 2 + 1)[:, None]
    sample = torch.arange(left, left + win_length)[None, :]
    # the product reduced modulo n_fft in integers first, so the float angle stays exact
    angle = torch.remainder(frequency * sample, n_fft).float() * (2 * math.pi / n_fft)
    window = 0.5 - 0.5 * torch.cos(
        torch.arange(win_length).float() * (2 * math.pi / win_length)
    )  # periodic Hann
    return torch.cat([torch.cos(angle) * window, torch.sin(angle) * window])[:, None, :]


class LogMel(nn.Module):
    """Waveform (B, T) -> log-mel (B, n_mels, frames), mean-subtracted over time per utterance.

    subtract_mean=False keeps each band's level, the loudness cues emotion needs.

    The short-time Fourier transform is a strided convolution with fixed windowed cosine and sine
    kernels: the same numbers as torch.stft(center=False) with the window zero-padded to n_fft, but
    exported as one Conv that onnxruntime runs several times faster than its STFT operator. Kernels and
    mel filters are computed in forward, not stored: the exported file carries the few operators that
    make them (onnxruntime folds them once when it loads the model) instead of 200 KB of constants.
    """

    def __init__(
        self,
        sample_rate: int,
        n_mels: int = 40,
        window_ms: float = 25.0,
        hop_ms: float = 10.0,
        subtract_mean: bool = True,
    ):
        super().__init__()
        self.sample_rate, self.n_mels, self.subtract_mean = sample_rate, n_mels, subtract_mean
        self.win_length = int(sample_rate * window_ms / 1000)
        self.hop_length = int(sample_rate * hop_ms / 1000)
        self.n_fft = 2 ** math.ceil(math.log2(self.win_length))
        self.bins = self.n_fft // 2 + 1
        # The zero padding of the window to n_fft multiplies samples by 0: the kernels cover only the
        # window itself, and the input is trimmed by the padding on each side instead.
        self.left = (self.n_fft - self.win_length) // 2
        self.right = self.n_fft - self.win_length - self.left

    def num_frames(self, num_samples: int) -> int:
        """Number of frames this front-end makes from num_samples samples."""
        return 1 + (num_samples - self.n_fft) // self.hop_length

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        inner = waveform[:, self.left : waveform.shape[-1] - self.right]
        kernels = dft_kernels(self.n_fft, self.win_length).to(waveform.dtype)
        spec = nn.functional.conv1d(inner[:, None, :], kernels, stride=self.hop_length)
        power = spec[:, : self.bins].square() + spec[:, self.bins :].square()
        mel = mel_filterbank(self.sample_rate, self.n_fft, self.n_mels).to(waveform.dtype)
        # The floor sits below quiet speech (median mel power on FSDD ~3e-3) but keeps the zero padding of
        # short clips from dominating the features at log(1e-6).
        logmel = torch.log(torch.matmul(mel, power) + 1e-4)
        if not self.subtract_mean:
            return logmel
        # per-utterance mean removal: a crude channel/speaker normalisation (like CMN)
        return logmel - logmel.mean(dim=-1, keepdim=True)
