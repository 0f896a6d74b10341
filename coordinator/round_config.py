"""How rounds run: the coordinator's settings for its round loop, each bounded as a task is."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedspeech.coordinator.strategies import strategy_params
from fedspeech.models.architectures import NEW_BLOCKS
from fedspeech.protocol.bounds import (
    MAX_BATCH_SIZE,
    MAX_COUNT,
    MAX_EPOCHS,
    MAX_LEARNING_RATE,
    MAX_TASK_SECONDS,
)
from fedspeech.protocol.weights import PRECISIONS, Precision


@dataclass(frozen=True)
class RoundConfig:
    """How rounds run."""

    rounds: int = 10
    min_devices: int = 2
    min_results: int = 2
    round_timeout_s: float = 120.0
    epochs: int = 2
    batch_size: int = 16
    learning_rate: float = 3e-3
    # the last round's learning rate as a fraction of the first's, reached along a cosine (1: constant)
    final_lr_fraction: float = 1.0
    # server momentum on the aggregate's step, FedAvgM (0: none)
    server_momentum: float = 0.0
    seed: int = 0
    strategy: str = "fedavg"  # a name in coordinator.strategies.STRATEGIES
    # devices aggregated per round by top-K and random-K strategies; the results a fedbuff round closes on
    k: int = 3
    # a transformer's depth by round: constant, linear (in depth_stages stages, 0: one block per stage)
    # or a list of depths such as "1,2,4"; see scheduling.depth_for_round
    depth_schedule: str = "linear"
    depth_stages: int = 0
    new_blocks: str = "fresh"  # how a block added by growth starts: fresh, or copied from the one below
    precision: Precision = "float32"  # of the weights devices download and upload; float16 halves the bytes
    # federated evaluation of the new global model on the devices' own test splits
    eval_every: int = 1  # every N rounds (and always the last); 0: never
    eval_devices: int = 0  # devices asked, sampled from those online; 0: all of them
    eval_timeout_s: float = 60.0
    eval_min_reports: int = 1  # fewer reports than this give no federated scores
    # an update counts for at most the samples its device reported, and at most this many
    max_device_samples: int = 100_000
    # the strategy's own settings, name -> value (text or number), checked against its Params
    strategy_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bounds = [
            ("epochs", self.epochs, 1, MAX_EPOCHS),
            ("batch_size", self.batch_size, 1, MAX_BATCH_SIZE),
            ("learning_rate", self.learning_rate, 1e-12, MAX_LEARNING_RATE),
            ("round_timeout_s", self.round_timeout_s, 1e-3, MAX_TASK_SECONDS),
            ("eval_timeout_s", self.eval_timeout_s, 1e-3, MAX_TASK_SECONDS),
            ("max_device_samples", self.max_device_samples, 1, MAX_COUNT),
            ("final_lr_fraction", self.final_lr_fraction, 1e-6, 1.0),
            ("server_momentum", self.server_momentum, 0.0, 0.99),
        ]
        for name, value, low, high in bounds:
            if not low <= value <= high:  # also refuses NaN
                raise ValueError(
                    f"{name} must be between {low:g} and {high:g} (a task's bounds), got {value}"
                )
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.new_blocks not in NEW_BLOCKS:
            raise ValueError(f"new_blocks must be one of {', '.join(NEW_BLOCKS)}, got {self.new_blocks!r}")
        strategy_params(self.strategy, self.strategy_options)  # refuses a bad name or setting
