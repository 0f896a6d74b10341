"""What the training benchmarks run and gather: arms, BenchConfig, SeedsConfig and bench seeds' Results.

The harness (`bench strategies`, `growing`, `poisoning`), `bench seeds` and the reports share these; the
module imports none of them, so that imports run one way: commands -> harness, seeds -> report -> here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedspeech_bench.fleets.fleet_files import DEFAULT_FLEETS, DeviceSpec, load_fleet
from fedspeech_bench.splits import SPLITS

if TYPE_CHECKING:  # the command line is built without the benchmark's heavy imports
    from fedspeech_bench.runs import Run

# Targets for rounds and time to target: each corpus' by default, which bench seeds' within-speaker
# splits use too.
DEFAULT_TARGETS = {"fsdd": 0.95, "emodb": 0.5, "speech_commands": 0.5}


@dataclass(frozen=True)
class Arm:
    """One contender: a name, the coordinator settings that make it, and devices that attack it."""

    name: str
    settings: Mapping[str, Any]  # fields of CoordinatorConfig by name, e.g. {"strategy": "fedbn"}
    attacks: Mapping[str, str] = field(default_factory=dict)  # speaker -> attack (fleets.poisoning)
    left_out: Sequence[str] = ()  # speakers whose devices do not take part


@dataclass(frozen=True)
class BenchConfig:
    """What to compare, on what, how often."""

    out: Path
    arms: Sequence[Arm]
    baseline: str  # the arm the others are measured against
    title: str = "fedspeech benchmark"
    corpora: Sequence[str] = ("fsdd", "emodb")
    seeds: int = 3
    rounds: int = 20
    data_dir: Path | None = None
    fleets: Mapping[str, list[DeviceSpec]] = field(default_factory=dict)  # default: load DEFAULT_FLEETS
    # per corpus, coordinator settings of every arm (under the arm's own), by name as Arm.settings
    corpus_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    targets: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TARGETS))
    round_timeout_s: float = 120.0
    # the corpus each entry of `corpora` trains on, where the entry is another name (a split, a fold)
    corpus_of: Mapping[str, str] = field(default_factory=dict)

    def fleet(self, corpus: str) -> list[DeviceSpec]:
        """The corpus' emulated fleet."""
        return self.fleets[corpus] if corpus in self.fleets else load_fleet(DEFAULT_FLEETS[corpus])

    def corpus_name(self, corpus: str) -> str:
        """The corpus (and built-in task) an entry of `corpora` trains on."""
        return self.corpus_of.get(corpus, corpus)


# bench seeds: arm -> coordinator settings (as Arm's); quality and mkd also get their shared folder
# (seeds.ARM_FOLDERS)
SEEDS_ARMS: dict[str, dict[str, Any]] = {
    "fedavg": {"strategy": "fedavg"},
    "fedprox": {"strategy": "fedprox"},
    "fedbn": {"strategy": "fedbn", "model": "cnn_bn"},
    "fedavg-bn": {"strategy": "fedavg", "model": "cnn_bn"},  # what FedBN is measured against
    "quality": {"strategy": "quality"},
    "grouped-1": {"strategy": "grouped", "strategy_settings": {"groups": 1}},
    "grouped-2": {"strategy": "grouped", "strategy_settings": {"groups": 2}},
    "grouped-N": {"strategy": "grouped", "strategy_settings": {"groups": 0}},  # one group per device
    "class_prior": {"strategy": "class_prior"},
    "mkd": {"strategy": "mkd"},
}


@dataclass(frozen=True)
class SeedsConfig:
    """What `bench seeds` runs."""

    out: Path
    splits: Sequence[str] = SPLITS
    arms: Sequence[str] = tuple(SEEDS_ARMS)
    seeds: int = 3
    rounds: int = 20
    folds: int | None = None  # LOSO: the first N speakers in sorted order; None for all
    data_dir: Path | None = None
    central: bool = True  # the centralized reference on the skewed fleet
    round_timeout_s: float = 120.0


@dataclass(frozen=True)
class CentralResult:
    """The CNN trained centrally on the skewed fleet's pooled training clips, scored on unseen speakers."""

    seed: int
    epochs: int
    accuracy: float
    seconds: float


@dataclass
class Results:
    """What bench seeds gathered: runs per split, failures, the skewed deal's centralized reference."""

    runs: dict[str, list[Run]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    central: list[CentralResult] = field(default_factory=list)
