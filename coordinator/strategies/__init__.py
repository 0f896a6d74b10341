"""Strategies, one file each behind the round hooks of `base.Strategy`, and the registry that names them."""

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from fedspeech.coordinator.strategies.base import (
    Needs,
    PrivacySpent,
    Result,
    RoundPlan,
    SecureTerms,
    ServerSide,
    Strategy,
    Work,
)
from fedspeech.coordinator.strategies.bulyan import Bulyan
from fedspeech.coordinator.strategies.ca2fl import CachedCalibration
from fedspeech.coordinator.strategies.class_prior import ClassPrior
from fedspeech.coordinator.strategies.differential_privacy import DifferentiallyPrivate, PrivacySettings
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.coordinator.strategies.fedbn import FedBN
from fedspeech.coordinator.strategies.fedbuff import FedBuff
from fedspeech.coordinator.strategies.fedbuff_silobn import FedBuffSiloBN
from fedspeech.coordinator.strategies.fedprox import FedProx
from fedspeech.coordinator.strategies.fedstaleweight import FedStaleWeight
from fedspeech.coordinator.strategies.grouped import GroupedSequential
from fedspeech.coordinator.strategies.hardware import HardwareAware
from fedspeech.coordinator.strategies.krum import Krum
from fedspeech.coordinator.strategies.median import FedMedian
from fedspeech.coordinator.strategies.mkd import MutualDistillation
from fedspeech.coordinator.strategies.norm_bounded import NormBounded
from fedspeech.coordinator.strategies.params import StrategyParams, parse
from fedspeech.coordinator.strategies.quality import QualityWeighted
from fedspeech.coordinator.strategies.random_k import RandomK
from fedspeech.coordinator.strategies.silobn import SiloBN
from fedspeech.coordinator.strategies.time_budget import TimeBudget
from fedspeech.coordinator.strategies.trimmed_mean import FedTrimmedMean

# name -> a strategy class, or one with some of its constructor's arguments fixed; it is called with
# (k, epochs, params): k devices aggregated per round where a strategy selects, epochs the local epochs of
# a round (the most capable device's, where epochs adapt), params its Params
STRATEGIES: dict[str, Callable[..., Strategy]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "random_k": RandomK,
    "hardware": HardwareAware,
    # the hardware-aware method's ablations: its selection alone, its adaptive epochs alone
    "topk_only": partial(HardwareAware, name="topk_only", adaptive=False, weighted=False),
    "epochs_only": partial(HardwareAware, name="epochs_only", top_k=False, weighted=False),
    # every device trains for the fastest one's time, FedNova-averaged
    "time_budget": TimeBudget,
    # slow devices train on across rounds; their late updates count, discounted by staleness
    "fedbuff": FedBuff,
    # ... with the slow devices' updates weighted up by how late they are, not down
    "fedstaleweight": FedStaleWeight,
    # ... with every device's last change in every round's step, calibrated by the new ones
    "ca2fl": CachedCalibration,
    # ... with each device running the model with its own clips' normalisation statistics (as silobn)
    "fedbuff_silobn": FedBuffSiloBN,
    # robust aggregation against poisoned updates (the benchmarks emulate the attacks)
    "median": FedMedian,
    "trimmed_mean": FedTrimmedMean,
    "norm_bounded": NormBounded,
    "norm_bounded_trimmed_mean": partial(FedTrimmedMean, norm_bounded=True),
    "krum": Krum,  # Multi-Krum with m > 1
    "bulyan": Bulyan,  # on Krum's picks, each weight trimmed around its median
    # the methods of FedCSR ("Cuing Without Sharing") and FedVMR, and FedBN, FedCSR's baseline
    "fedbn": FedBN,
    # FedAvg, each device running the model with the normalisation statistics of its own clips
    "silobn": SiloBN,
    "quality": QualityWeighted,
    "grouped": GroupedSequential,
    "class_prior": ClassPrior,
    "mkd": MutualDistillation,
}


def strategy_class(name: str) -> type[Strategy]:
    """The class behind a registered name; ValueError naming the known ones for any other."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}, expected one of {', '.join(STRATEGIES)}")
    factory = STRATEGIES[name]
    return factory.func if isinstance(factory, partial) else factory  # type: ignore[return-value]


def strategy_params(name: str, options: Mapping[str, Any] | None = None) -> StrategyParams:
    """A strategy's Params from name=value options; ValueError with one line naming the strategy."""
    cls = strategy_class(name)
    try:
        return parse(cls.Params, options or {})
    except ValueError as exc:
        raise ValueError(f"strategy {name}: {exc}") from None


def make_strategy(
    name: str,
    k: int,
    epochs: int,
    settings: StrategyParams | None = None,
    privacy: PrivacySettings | None = None,
) -> Strategy:
    """A fresh strategy by name with its settings (None: its defaults), wrapped in differential privacy
    where privacy is given; ValueError for an unknown name or a strategy privacy cannot wrap.
    """
    strategy_class(name)  # refuses an unknown name with the known ones
    strategy = STRATEGIES[name](k, epochs, settings)
    return DifferentiallyPrivate(strategy, privacy) if privacy is not None else strategy


def summing() -> list[str]:
    """The strategies a secure sum can run: those whose new model a sum of the updates gives."""
    return [name for name in STRATEGIES if make_strategy(name, 1, 1).secure_terms() is not None]


__all__ = [
    "STRATEGIES",
    "Needs",
    "PrivacySettings",
    "PrivacySpent",
    "Result",
    "RoundPlan",
    "SecureTerms",
    "ServerSide",
    "Strategy",
    "StrategyParams",
    "Work",
    "make_strategy",
    "strategy_class",
    "strategy_params",
    "summing",
]
