"""Which of a model's tensors belong to batch normalisation: the layers FedBN keeps on each device."""

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
