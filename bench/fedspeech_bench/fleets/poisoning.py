"""Model poisoning, for emulated benchmarks only: a device trains honestly, then uploads a tampered update.

"scale" multiplies its change to the model by 100, so that it dominates a plain average (model
replacement, Bagdasaryan et al. 2020, "How to backdoor federated learning"); "sign_flip" sends the
change reversed, pushing the model away from where the honest devices move it; "scaled_global" sends -3
x the global weights it was given, claims 100,000 samples and reports a billion correct test clips per
label, the attack that took a live deployment from 0.95 to 0.02 accuracy in one round. The daemon
builds its trainer with `attacking_trainer(attack)` in place of `Trainer`.
"""

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from fedspeech.edge_client.local_data import Split
from fedspeech.edge_client.trainer import Trainer
from fedspeech.protocol import messages, weights
from fedspeech.protocol.messages import EvaluationReport, Task
from fedspeech.protocol.weights import Arrays

# attack -> the factor its change to the model is multiplied by, or for an attack in GLOBAL the weights
# it was given
ATTACKS = {"scale": 100.0, "sign_flip": -1.0, "scaled_global": -3.0}
GLOBAL = {"scaled_global"}
CLAIMS = {"scaled_global": 100_000}  # attack -> the samples its uploads claim (else the honest count)
FAKED_REPORTS = {"scaled_global": 10**9}  # attack -> the correct test clips per label its reports claim


def _factor(attack: str) -> float:
    if attack not in ATTACKS:
        raise ValueError(f"unknown attack {attack!r}, expected one of {', '.join(ATTACKS)}")
    return ATTACKS[attack]


def tamper(start: Arrays, trained: Arrays, attack: str) -> Arrays:
    """The attack's weights, each array in its own dtype: start + factor * (trained - start), or for an
    attack on the global weights, factor * start.
    """
    factor = _factor(attack)
    tampered = {}
    for name, value in trained.items():
        begin = start[name].astype(np.float64)
        if attack in GLOBAL:
            tampered[name] = (factor * begin).astype(value.dtype)
        else:
            tampered[name] = (begin + factor * (value.astype(np.float64) - begin)).astype(value.dtype)
    return tampered


class AttackingTrainer(Trainer):
    """A Trainer whose uploads carry a tampered update with the honest run's metadata (its sample count
    replaced by the attack's claim, if it has one).
    """

    def __init__(self, device_id: str, torch_threads: int = 1, *, attack: str, from_round: int = 1) -> None:
        _factor(attack)
        super().__init__(device_id, torch_threads)
        self.attack, self.from_round = attack, from_round

    def train(
        self, task: Task, arrays: Arrays, train: Split, teacher: Arrays | None = None
    ) -> tuple[Any, bytes]:
        """Train honestly from the given weights, then (from from_round on) tamper with the change before it
        is uploaded.
        """
        result, upload = super().train(task, arrays, train, teacher)
        if task.round < self.from_round:
            return result, upload
        trained, metadata = weights.decode(upload)
        if self.attack in CLAIMS:
            metadata = {**metadata, "num_samples": str(CLAIMS[self.attack])}
        return result, weights.encode(tamper(arrays, trained, self.attack), metadata=metadata)

    def evaluate(self, task: Task, arrays: Arrays, test: Split, train: Split | None = None) -> bytes:
        """The honest report, or for an attack that fakes them, every label's clips all counted correct."""
        if self.attack not in FAKED_REPORTS or task.round < self.from_round:
            return super().evaluate(task, arrays, test, train)
        correct = np.diag([FAKED_REPORTS[self.attack]] * task.spec.num_classes)
        return messages.encode(EvaluationReport(task.task_id, task.round, correct.tolist(), 0.0))


def attacking_trainer(attack: str, from_round: int = 1) -> Callable[[str, int], Trainer]:
    """A factory like `Trainer(device_id, torch_threads)` building trainers that mount the given attack from
    the tasks of round from_round on (honest before).
    """
    _factor(attack)
    return partial(AttackingTrainer, attack=attack, from_round=from_round)
