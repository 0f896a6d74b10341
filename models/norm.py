"""Batch normalisation: which of a model's tensors belong to it, and its statistics re-estimated."""

import math

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def norm_names(model: nn.Module) -> set[str]:
    """State-dict names of every BatchNorm layer's floating-point tensors (weight, bias, running stats).

    FedBN (Li et al. 2021) leaves these out of aggregation; GroupNorm and LayerNorm are not among them.
    The integer counter num_batches_tracked is left out, as get_arrays leaves it out.
    """
    names = set()
    for prefix, module in model.named_modules():
        if isinstance(module, _BatchNorm):
            for name, tensor in module.state_dict(prefix=f"{prefix}." if prefix else "").items():
                if tensor.is_floating_point():
                    names.add(name)
    return names


def statistic_names(model: nn.Module) -> set[str]:
    """State-dict names of every BatchNorm layer's running mean and variance: what SiloBN keeps local."""
    return {name for name in norm_names(model) if name.rsplit(".", 1)[-1] in ("running_mean", "running_var")}


@torch.no_grad()
def refresh_statistics(model: nn.Module, waveforms: np.ndarray, batch_size: int) -> None:
    """Re-estimate every BatchNorm layer's running mean and variance at the model's present weights.

    The running statistics of a short training run are an average that trails the weights: a device
    taking a few steps a round moves them only part of the way to its own data, and FedAvg then averages
    statistics that belong to none of the weights. Like PreciseBN ("Rethinking 'Batch' in BatchNorm", Wu
    and Johnson 2021), this takes them again as the plain mean over batches of batch_size clips (near equal
    in size) of one forward pass, without gradients. Weights are untouched; the model is left in eval mode.
    """
    layers = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    if not layers or len(waveforms) == 0:
        return
    momenta = [layer.momentum for layer in layers]
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None  # a cumulative average: each batch counts the same
    model.train()
    try:
        waveforms = np.ascontiguousarray(waveforms, dtype=np.float32)
        for batch in np.array_split(waveforms, math.ceil(len(waveforms) / batch_size)):
            model(torch.from_numpy(batch))
    finally:
        for layer, momentum in zip(layers, momenta, strict=True):
            layer.momentum = momentum
        model.eval()
