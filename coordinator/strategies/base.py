"""The round hooks every strategy implements, and what passes through them.

A strategy decides who trains each round and with what settings (`configure_round`), combines the
accepted updates and the global model they started from into the new global model (`aggregate`) and
keeps whatever it needs across rounds (`on_round_end`). The orchestrator calls only these hooks and
knows no strategy by name.
"""

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

import numpy as np

from fedspeech.coordinator.aggregate import fedavg
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.weights import Arrays


@dataclass(frozen=True)
class Work:
    """What one selected device is asked to do: its local epochs and the method's training settings."""

    epochs: int
    config: Mapping[str, float] = field(default_factory=dict)  # sent in the task, e.g. FedProx's mu


@dataclass(frozen=True)
class RoundPlan:
    """Who trains with what, how many of the first results are aggregated, and who is waited for anyway."""

    work: dict[str, Work]  # in the order the devices were chosen
    needed: int  # results aggregated from the devices not required
    required: list[str] = field(default_factory=list)  # waited for on top of the needed results

    @property
    def selected(self) -> list[str]:
        """The devices asked to train."""
        return list(self.work)


@dataclass(frozen=True)
class Result:
    """An accepted update: whose it is, its weights and how many samples it was trained on."""

    device_id: str
    arrays: Arrays
    num_samples: int


class Strategy(ABC):
    """Chooses each round's devices and settings and combines their updates; may keep state across rounds."""

    name = ""

    def __init__(self, k: int, epochs: int) -> None:
        if k < 1 or epochs < 1:
            raise ValueError("k and epochs must be at least 1")
        self.k, self.epochs = k, epochs

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
