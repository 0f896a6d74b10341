"""The round hooks every strategy implements, and what passes through them.

A strategy decides who trains each round and with what settings (`configure_round`), combines the
accepted updates and the global model they started from into the new global model (`aggregate`) and
keeps whatever it needs across rounds (`on_round_end`). The orchestrator calls only these hooks and
knows no strategy by name. What a method needs of the orchestrator beyond them it says in four flags:
`personal` (the task settings with which each device trains and evaluates a model of its own, such as
FedBN's normalisation layers that stay on the devices), `scored` (each update scored on the
coordinator's validation set), `distils` (a server model trained after each round, sent as teacher)
and `buffered` (a device still training when its round closes goes on, and its update counts in a
later round).
"""

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fedspeech.coordinator.aggregate import fedavg
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


@dataclass(frozen=True)
class MethodSettings:
    """The settings of the methods that have some; each strategy reads its own."""

    groups: int = 0  # grouped sequential training: groups of a round; 0: one per device (FedAvg)
    quality_temperature: float = 0.1  # quality-weighted aggregation: softmax(score / temperature)
    quality_by_samples: bool = False  # ... times each update's samples
    prior_weight: float = 1.0  # the class-distribution regulariser's lambda
    distill_weight: float = 1.0  # mutual knowledge distillation: the distillation term's weight
    distill_temperature: float = 2.0  # ... and its temperature

    def __post_init__(self) -> None:
        if self.groups < 0:
            raise ValueError("groups must not be negative")
        positive = (
            ("quality_temperature", self.quality_temperature),
            ("distill_temperature", self.distill_temperature),
        )
        for name, value in positive:
            if not 0.01 <= value <= 100:
                raise ValueError(f"{name} must be between 0.01 and 100, got {value}")
        for name, value in ("prior_weight", self.prior_weight), ("distill_weight", self.distill_weight):
            if not 0 <= value <= 100:
                raise ValueError(f"{name} must be between 0 and 100, got {value}")


class Strategy(ABC):
    """Chooses each round's devices and settings and combines their updates; may keep state across rounds."""

    name = ""
    # the task settings that have a device train and evaluate with normalisation of its own: FedBN's
    # local_norm (the layers stay on the device, uploads hold the other arrays), SiloBN's local_statistics
    personal: ClassVar[Mapping[str, float]] = {}
    scored = False  # the orchestrator fills each Result's score from its validation set
    distils = False  # the orchestrator trains a server model after each round and sends it as teacher
    buffered = False  # devices that miss a round train on, and their updates count in a later round

    def __init__(self, k: int, epochs: int) -> None:
        if k < 1 or epochs < 1:
            raise ValueError("k and epochs must be at least 1")
        self.k, self.epochs = k, epochs
        self.settings = MethodSettings()  # make_strategy gives the configured ones

    @abstractmethod
    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """The plan of a round, given the devices available with their measured profiles."""

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """The new global weights from the results and current, the model they started from: FedAvg."""
        return fedavg([r.arrays for r in results], [r.num_samples for r in results])

    def on_round_end(  # noqa: B027 - a hook: most strategies keep nothing across rounds
        self, round: int, plan: RoundPlan, on_time: Set[str], deadline_missed: bool, aggregated: Sequence[str]
    ) -> None:
        """Bookkeeping once the round closed; aggregated is empty when the round is run again."""
