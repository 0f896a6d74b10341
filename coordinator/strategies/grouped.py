"""Grouped sequential training, as in "FedVMR: A New Federated Learning method for Video Moment Retrieval".

A round's devices are dealt into G groups. Inside a group the model passes from device to device: each
starts from the update of the one before, relayed by the coordinator; groups run in parallel, and the
last model of each group is averaged, weighted by the samples the group trained on. G = 1 is fully
sequential; G = the number of devices is FedAvg. A device that does not answer by its deadline is
skipped, and its group goes on from the last good model.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedspeech.coordinator.strategies.base import RoundPlan
from fedspeech.coordinator.strategies.fedavg import FedAvg
from fedspeech.coordinator.strategies.params import StrategyParams, setting
from fedspeech.protocol.messages import Profile


def deal_groups(devices: Sequence[str], groups: int, rng: np.random.Generator) -> list[list[str]]:
    """The devices shuffled and dealt round-robin into groups (0: one each); at most one group per device."""
    if not devices:
        return []
    count = len(devices) if groups == 0 else min(groups, len(devices))
    order = [devices[i] for i in rng.permutation(len(devices))]
    return [order[g::count] for g in range(count)]


class GroupedSequential(FedAvg):
    """All devices, fixed epochs, trained in groups one after another; the groups' models averaged."""

    name = "grouped"
    mode = "chained"

    @dataclass(frozen=True)
    class Params(StrategyParams):
        """Grouped training's settings."""

        groups: int = setting(0, 0, 10_000, "groups trained side by side (0: one per device, FedAvg)")

    params: Params

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """FedAvg's devices dealt into groups, a new deal every round; one result per group is aggregated."""
        plan = super().configure_round(round, pool, rng)
        groups = deal_groups(plan.selected, self.params.groups, rng)
        return RoundPlan(plan.work, needed=len(groups), groups=groups)
