"""A small speech transformer whose encoder can grow block by block (FL with Dynamic Transformer for TTS).

Log-mel front-end -> two strided convolutions (4x fewer frames) -> `depth` encoder blocks -> final
LayerNorm -> mean over time -> linear head. Sized for a Pi: width 64, 4 heads, feed-forward 256, at
most 4 blocks: 0.22 M parameters and 22.9 MFLOP per 1 s window at 8 kHz, 12.5 of them the front-end.

Two stabilisers from the seed, each switchable for its ablation:
- pre-LayerNorm ("Front-LN"): each block computes x + f(LN(x)), so a block whose output projections
  are zero is the identity and adding it leaves the model's function unchanged; post-LN computes
  LN(x + f(x)), whose LayerNorm, fresh at growth, undoes the trained scale of the block below.
- run-time weight scaling: a layer stores w ~ N(0, 1) and uses w * sqrt(2 / fan_in) (He's constant),
  so Adam, whose steps do not depend on the weights' scale, moves every layer at the same relative
  rate. Without it the layer stores He-initialised weights and uses them as they are.
"""

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fedspeech.models.architectures import MAX_DEPTH
from fedspeech.models.frontend import LogMel

WIDTH = 64
HEADS = 4
FEED_FORWARD = 256


class ScaledLinear(nn.Module):
    """A linear layer, optionally with run-time He scaling; zero_init starts it at exactly zero."""

    def __init__(self, in_features: int, out_features: int, *, scaled: bool, zero_init: bool = False):
        super().__init__()
        he = math.sqrt(2.0 / in_features)
        self.gain = he if scaled else 1.0
        std = 0.0 if zero_init else (1.0 if scaled else he)
        self.weight = nn.Parameter(torch.randn(out_features, in_features) * std)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight * self.gain, self.bias)


class ScaledConv1d(nn.Module):
    """A strided 1-D convolution, optionally with run-time He scaling."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, *, scaled: bool):
        super().__init__()
        he = math.sqrt(2.0 / (in_channels * kernel_size))
        self.gain, self.stride, self.padding = (he if scaled else 1.0), stride, kernel_size // 2
        std = 1.0 if scaled else he
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size) * std)
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def forward(self, x: Tensor) -> Tensor:
        return F.conv1d(x, self.weight * self.gain, self.bias, stride=self.stride, padding=self.padding)


class Block(nn.Module):
    """One encoder block: multi-head self-attention and a feed-forward layer, each with a residual."""

    def __init__(self, *, pre_norm: bool, scaled: bool):
        super().__init__()
        self.pre_norm = pre_norm
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv = ScaledLinear(WIDTH, 3 * WIDTH, scaled=scaled)
        # zero output projections: a new block adds nothing to the residual stream until trained
        self.out = ScaledLinear(WIDTH, WIDTH, scaled=scaled, zero_init=True)
        self.ff1 = ScaledLinear(WIDTH, FEED_FORWARD, scaled=scaled)
        self.ff2 = ScaledLinear(FEED_FORWARD, WIDTH, scaled=scaled, zero_init=True)

    def _attention(self, x: Tensor) -> Tensor:
        batch, frames, _ = x.shape
        q, k, v = self.qkv(x).view(batch, frames, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(WIDTH // HEADS), dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, frames, WIDTH))

    def _feed_forward(self, x: Tensor) -> Tensor:
        return self.ff2(F.gelu(self.ff1(x)))

    def forward(self, x: Tensor) -> Tensor:
        if self.pre_norm:
            x = x + self._attention(self.norm1(x))
            return x + self._feed_forward(self.norm2(x))
        x = self.norm1(x + self._attention(x))
        return self.norm2(x + self._feed_forward(x))


def _positions(frames: int, width: int) -> Tensor:
    """Sinusoidal position encodings (frames, width): fixed, so nothing to train or send."""
    position = torch.arange(frames, dtype=torch.float32)[:, None]
    rate = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    encoding = torch.zeros(frames, width)
    encoding[:, 0::2], encoding[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
    return encoding


class SpeechTransformer(nn.Module):
    """Waveform (B, num_samples) -> logits (B, num_classes) through `depth` encoder blocks."""

    def __init__(
        self,
        sample_rate: int,
        num_samples: int,
        num_classes: int,
        depth: int,
        *,
        pre_norm: bool = True,
        scaled: bool = True,
        n_mels: int = 40,
    ):
        super().__init__()
        if not 1 <= depth <= MAX_DEPTH:
            raise ValueError(f"depth must be between 1 and {MAX_DEPTH}, got {depth}")
        self.frontend = LogMel(sample_rate, n_mels)
        self.input_norm = nn.GroupNorm(1, n_mels)  # standardises each utterance's log-mel
        self.stem1 = ScaledConv1d(n_mels, WIDTH, 3, 2, scaled=scaled)
        self.stem2 = ScaledConv1d(WIDTH, WIDTH, 3, 2, scaled=scaled)
        frames = self.frontend.num_frames(num_samples)
        for _ in range(2):
            frames = (frames - 1) // 2 + 1
        self.register_buffer("positions", _positions(frames, WIDTH), persistent=False)
        self.blocks = nn.ModuleList(Block(pre_norm=pre_norm, scaled=scaled) for _ in range(depth))
        # pre-LN leaves the residual stream unnormalised, so it ends with a LayerNorm; post-LN already
        # normalised it in the last block (adding one here would hide growth's change of function)
        self.final_norm = nn.LayerNorm(WIDTH) if pre_norm else nn.Identity()
        self.head = ScaledLinear(WIDTH, num_classes, scaled=scaled)

    def forward(self, waveform: Tensor) -> Tensor:
        x = self.input_norm(self.frontend(waveform))
        x = F.gelu(self.stem2(F.gelu(self.stem1(x))))
        x = x.transpose(1, 2) + self.get_buffer("positions")
        for block in self.blocks:
            x = block(x)
        return self.head(self.final_norm(x).mean(dim=1))
