"""Strategies: a selection rule, an epoch schedule and an aggregation rule, and the plan of one round."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np

from fedspeech.coordinator.aggregate import fedavg, hardware_weighted
from fedspeech.coordinator.scheduling import adaptive_epochs, fixed_epochs
from fedspeech.coordinator.selection import (
    DEFAULT_WEIGHTS,
    ScoreWeights,
    hardware_scores,
    select_all,
    select_random,
    select_top_k,
)
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.weights import Arrays

Selection = Literal["all", "random", "top_k"]
Epochs = Literal["fixed", "adaptive"]
Aggregation = Literal["fedavg", "hardware"]


@dataclass(frozen=True)
class Strategy:
    """How rounds choose devices, set their local epochs and combine their updates."""

    name: str
    selection: Selection
    epochs: Epochs
    aggregation: Aggregation
    proximal_mu: float = 0.0  # FedProx's mu, sent to the devices; 0 is plain local training
    over_select: float = 1.3  # top_k: devices asked per result needed, so stragglers can be cut
    explore: float = 0.1  # top_k: chance that a slot goes to a random device instead of the next best
    # top_k: a device whose update has not been aggregated for this many rounds is asked and waited
    # for, however slow, so no device's data is lost to the model for good (0: never)
    max_staleness: int = 0

    def __post_init__(self) -> None:
        for value, kind in (
            (self.selection, Selection),
            (self.epochs, Epochs),
            (self.aggregation, Aggregation),
        ):
            if value not in get_args(kind):
                raise ValueError(f"{value!r} is not one of {get_args(kind)}")
        if (
            self.proximal_mu < 0
            or self.over_select < 1
            or not 0 <= self.explore <= 1
            or self.max_staleness < 0
        ):
            raise ValueError("need proximal_mu >= 0, over_select >= 1, 0 <= explore <= 1, max_staleness >= 0")


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("fedavg", "all", "fixed", "fedavg"),
        Strategy("fedprox", "all", "fixed", "fedavg", proximal_mu=0.01),
        Strategy("random_k", "random", "fixed", "fedavg"),
        Strategy("hardware", "top_k", "adaptive", "hardware", max_staleness=5),  # the seed's full method
        Strategy("topk_only", "top_k", "fixed", "fedavg", max_staleness=5),  # its ablations: selection ...
        Strategy("epochs_only", "all", "adaptive", "fedavg"),  # ... and adaptive epochs alone
    )
}


@dataclass(frozen=True)
class RoundPlan:
    """One round: devices asked, their local epochs, how many of the first results to aggregate."""

    selected: list[str]
    epochs: dict[str, int]
    needed: int  # results aggregated from the devices not required
    scores: dict[str, float] = field(default_factory=dict)  # S_i of the whole pool the plan was made from
    required: list[str] = field(default_factory=list)  # stale devices, waited for on top of `needed`


def plan_round(
    strategy: Strategy,
    profiles: Mapping[str, Profile],
    *,
    k: int,
    e_max: int,
    rng: np.random.Generator,
    weights: ScoreWeights = DEFAULT_WEIGHTS,
    penalties: Mapping[str, float] | None = None,
    staleness: Mapping[str, int] | None = None,
) -> RoundPlan:
    """Select the devices of a round and their local epochs; k beyond the pool is clamped.

    staleness: rounds since each device's update was last aggregated (absent: never).
    """
    if k < 1 or e_max < 1:
        raise ValueError("k and e_max must be at least 1")
    devices = sorted(profiles)
    k = min(k, len(devices))
    scores = hardware_scores(profiles, weights, penalties)
    required: list[str] = []
    if strategy.selection == "all":
        selected = select_all(devices)
        needed = len(selected)
    elif strategy.selection == "random":
        selected = select_random(devices, k, rng)
        needed = k
    else:
        selected = select_top_k(
            scores, k, over_select=strategy.over_select, explore=strategy.explore, rng=rng
        )
        needed = min(k, len(selected))
        if strategy.max_staleness:
            stale = [d for d in devices if (staleness or {}).get(d, 0) >= strategy.max_staleness]
            required = [d for d in stale if d not in selected[:needed]]
            selected = [d for d in selected if d not in required] + required
            needed = min(needed, len(selected) - len(required))
    if strategy.epochs == "adaptive":
        # S_max over the devices of this round: its most capable one trains e_max epochs.
        epochs = adaptive_epochs({d: scores[d] for d in selected}, e_max)
    else:
        epochs = fixed_epochs(selected, e_max)
    return RoundPlan(selected=selected, epochs=epochs, needed=needed, scores=scores, required=required)


def aggregate(
    strategy: Strategy,
    updates: Sequence[Arrays],
    num_samples: Sequence[int],
    scores: Sequence[float] | None = None,
) -> Arrays:
    """Combine the updates with the strategy's rule: FedAvg (n_i) or hardware-weighted (n_i * S_i)."""
    if strategy.aggregation == "fedavg":
        return fedavg(updates, num_samples)
    if scores is None:
        raise ValueError("hardware-weighted aggregation needs the devices' scores")
    return hardware_weighted(updates, num_samples, scores)
