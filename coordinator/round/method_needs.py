"""What a strategy needs of the model and coordinator beyond the round hooks, checked at start-up."""

from fedspeech.coordinator.round.interfaces import ModelOps
from fedspeech.coordinator.strategies import Strategy


def local_names(strategy: Strategy, model: ModelOps) -> frozenset[str]:
    """The arrays kept on devices; ValueError if the strategy needs what the model or coordinator lacks."""
    name = strategy.name
    if strategy.needs.validation and not model.can_score:
        raise ValueError(
            f"{name} scores each update on a validation set: give one (--validation-data DIR), or take "
            "clips devices share (--shared-validation N)"
        )
    if strategy.needs.server_data and not model.can_distil:
        raise ValueError(
            f"{name} trains a server model on the coordinator's data: give it (--server-data DIR)"
        )
    if not strategy.needs.batch_norm:
        return frozenset()
    local = frozenset(model.norm_names())
    if not local:
        raise ValueError(
            f"{name} keeps batch normalisation of their own on the devices and the model "
            f"{model.spec.name} has none: use a model with it (--model cnn_bn)"
        )
    return local if "local_norm" in strategy.personal else frozenset()
