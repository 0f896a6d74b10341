"""The round hooks every strategy implements, and what passes through them.

A strategy decides who trains each round and with what settings (`configure_round`), may prepare the
accepted updates (`before_aggregate`: scored on the coordinator's validation set), combines them and the
global model they started from into the new global model (`aggregate`), says how a secure sum gives that
model where one can (`secure_terms`), may train a model of its own from it (`after_aggregate`: a teacher
sent with the next tasks, taken back after a restart by `restore`), reports the differential privacy its
rounds spend (`privacy_after`) and keeps whatever it needs across rounds (`on_round_end`). The
orchestrator calls only these hooks and knows no strategy by name. Differential privacy is itself a
strategy around another (differential_privacy.DifferentiallyPrivate), as Flower's is.

Beside its hooks a strategy declares its settings (`Params`, a frozen dataclass with bounds), what it
`needs` (batch normalisation, a validation set, server data, a minimum of results) and its round `mode`:
parallel (every selected device trains from the global model), buffered (a device still training when
its round closes goes on, and its update counts in a later round) or chained (groups of devices train one
after another). `personal` holds the task settings with which each device trains and evaluates a model of
its own (FedBN's normalisation layers that stay on the devices, SiloBN's statistics).

Where a method's maths lives: in its strategy's file when that strategy alone uses it (Krum's scores,
differential privacy's noise and clip); in `aggregate` when several strategies or the round loop share it.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, Protocol

import numpy as np

from fedspeech.coordinator.strategies.aggregate import fedavg
from fedspeech.coordinator.strategies.params import StrategyParams
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.weights import Arrays


@dataclass(frozen=True)
class Work:
    """What one selected device is asked to do: its local epochs and the method's training settings."""

    epochs: int
    config: Mapping[str, float | list[float]] = field(default_factory=dict)  # sent in the task, e.g. mu


@dataclass(frozen=True)
class RoundPlan:
    """Who trains with what, how many of the first results are aggregated, and who is waited for anyway."""

    work: dict[str, Work]  # in the order the devices were chosen
    needed: int  # results aggregated from the devices not required
    required: list[str] = field(default_factory=list)  # waited for on top of the needed results
    # devices trained one after another, each from the update of the one before; empty: all in parallel
    groups: list[list[str]] = field(default_factory=list)

    @property
    def selected(self) -> list[str]:
        """The devices asked to train."""
        return list(self.work)


@dataclass(frozen=True)
class Result:
    """An accepted update: whose it is, its weights and how many samples it was trained on.

    Where a method asks for them, also its score on the coordinator's validation set and the device's
    predicted class counts on its own clips; and the optimiser steps it says it took, where it says so.
    A buffered method's late update is already laid onto the current model; staleness says how many
    rounds late it is.
    """

    device_id: str
    arrays: Arrays
    num_samples: int
    score: float | None = None
    predicted_counts: tuple[int, ...] | None = None
    steps: int | None = None
    staleness: int = 0


Mode = Literal["parallel", "buffered", "chained"]


@dataclass(frozen=True)
class PrivacySpent:
    """Differential privacy's guarantee after some rounds: (epsilon, delta)."""

    epsilon: float
    delta: float
    budget: float | None = None  # the epsilon no round may pass; None: none

    def past_budget(self, round: int) -> str | None:
        """Why round may not train, in one line: it would spend more than the budget; None: it may."""
        if self.budget is None or self.epsilon <= self.budget:
            return None
        return (
            f"the privacy budget is spent: round {round} would bring epsilon to {self.epsilon:.3g}, past "
            f"{self.budget:g} at delta {self.delta:g}; training stops, round {round - 1}'s model stays"
        )


@dataclass(frozen=True)
class SecureTerms:
    """How a secure sum gives a strategy's new model: the changes' clip, the noise the devices add to it,
    whether changes are weighted by their clips, and what the sum is divided by.
    """

    clip: float | None = None  # each change's L2 norm; None: the coordinator's secure_norm_bound
    # Gaussian noise on the sum, as a multiple of the clip: the devices add it in parts, so that no one
    # ever sees the sum without it (distributed differential privacy)
    noise_multiplier: float = 0.0
    weighted: bool = True  # each change weighted by the device's clips; False: all alike
    denominator: float | None = None  # the sum divided by it; None: the weights of the changes summed
    # adaptive clipping: each device adds +count_scale/2 after its change if it was within the clip
    # before clipping, -count_scale/2 if not, noised with it; 0: nothing added
    count_scale: float = 0.0
    # what hears the round's noised count of changes within the clip, (round, count), where there is one
    on_count: Callable[[int, float], None] | None = None


@dataclass(frozen=True)
class Needs:
    """What a strategy needs beyond devices that train: checked before a run starts."""

    batch_norm: bool = False  # a model with batch normalisation (FedBN, SiloBN)
    validation: bool = False  # a validation set on the coordinator, to score each update
    server_data: bool = False  # clips of the coordinator's own, to train a server model on
    min_devices: int = 1  # results a round must have for the aggregation to mean anything


class ServerSide(Protocol):
    """What the coordinator's own data does for a strategy that asks for it (see Needs)."""

    def score(self, arrays: Arrays) -> float | None:
        """An update's accuracy on the validation set; None while there are no clips."""

    def distil(self, student: Arrays, teacher: Arrays, temperature: float, round: int) -> Arrays:
        """The student trained on the server's clips towards the teacher's soft labels."""


class Strategy(ABC):
    """Chooses each round's devices and settings and combines their updates; may keep state across rounds."""

    name = ""
    Params: type[StrategyParams] = StrategyParams  # a strategy with settings declares its own
    needs = Needs()
    mode: Mode = "parallel"  # buffered: devices that miss a round train on and count later; chained: groups
    # the task settings that have a device train and evaluate with normalisation of its own: FedBN's
    # local_norm (the layers stay on the device, uploads hold the other arrays), SiloBN's local_statistics
    personal: Mapping[str, float] = MappingProxyType({})

    def __init__(self, k: int, epochs: int, params: StrategyParams | None = None) -> None:
        if k < 1 or epochs < 1:
            raise ValueError("k and epochs must be at least 1")
        self.k, self.epochs = k, epochs
        self.params = params if params is not None else self.Params()
        if not isinstance(self.params, self.Params):
            raise TypeError(f"{self.name} takes {self.Params.__qualname__}, got {type(self.params).__name__}")

    @abstractmethod
    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """The plan of a round, given the devices available with their measured profiles."""

    def before_aggregate(self, round: int, results: list[Result], server: ServerSide) -> list[Result]:
        """The results as aggregate should see them, e.g. scored on the validation set: as they are."""
        return results

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """The new global weights from the results and current, the model they started from: FedAvg."""
        return fedavg([r.arrays for r in results], [r.num_samples for r in results])

    def secure_terms(self) -> SecureTerms | None:
        """How a secure sum gives this round's new model without the coordinator seeing one update, or
        None where it cannot: here FedAvg, for a strategy that trains in parallel and neither scores nor
        combines updates its own way.
        """
        own = type(self)
        plain = own.aggregate is Strategy.aggregate and own.before_aggregate is Strategy.before_aggregate
        return SecureTerms() if plain and self.mode == "parallel" else None

    def privacy_after(self, rounds: int) -> PrivacySpent | None:
        """The differential privacy spent once `rounds` rounds are aggregated: none guaranteed."""
        return None

    def after_aggregate(self, round: int, new: Arrays, server: ServerSide) -> Arrays | None:
        """A model the devices download beside the global one (a teacher), or None: none."""
        return None

    def restore(self, teacher: Arrays) -> None:  # noqa: B027 - a hook: only a strategy with a teacher has state
        """Take back the model after_aggregate last returned, after a restart."""

    def on_round_end(  # noqa: B027 - a hook: most strategies keep nothing across rounds
        self, round: int, plan: RoundPlan, on_time: Set[str], deadline_missed: bool, aggregated: Sequence[str]
    ) -> None:
        """Bookkeeping once the round closed; aggregated is empty when the round is run again."""
