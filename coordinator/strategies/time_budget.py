"""Time-budgeted training: every device trains for the same seconds; FedNova averages the unequal steps.

All devices finish together. The budget is what the fastest device needs for the round's epochs (its
measured seconds per sample times the samples its last update counted); a slower device trains for as
long, so fewer steps, and FedNova (Wang et al. 2020) keeps those fewer steps from counting for less in
the average. Before any device has sent an update the budget is unknown, and the first round trains
the epochs themselves.
"""

from collections.abc import Mapping, Sequence

import numpy as np

from fedspeech.coordinator.strategies.aggregate import fedavg, fednova
from fedspeech.coordinator.strategies.base import Result, RoundPlan, Strategy, Work
from fedspeech.coordinator.strategies.params import StrategyParams
from fedspeech.coordinator.strategies.selection import select_all
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.weights import Arrays


def time_budget(pool: Mapping[str, Profile], samples: Mapping[str, int], epochs: int) -> float | None:
    """Seconds the fastest device of the pool needs for `epochs` epochs; None if no device's is known."""
    times = [
        profile.seconds_per_sample * samples[device] * epochs
        for device, profile in pool.items()
        if profile.seconds_per_sample and device in samples
    ]
    return min(times) if times else None


class TimeBudget(Strategy):
    """All devices, the same seconds of training each, FedNova's normalised average."""

    name = "time_budget"

    def __init__(self, k: int, epochs: int, params: StrategyParams | None = None) -> None:
        super().__init__(k, epochs, params)
        self.samples: dict[str, int] = {}  # what each device's last accepted update counted

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """Every device, with the round's time budget (none before the first updates)."""
        devices = select_all(list(pool))
        budget = time_budget({d: pool[d] for d in devices}, self.samples, self.epochs)
        config = {} if budget is None else {"time_budget_s": budget}
        return RoundPlan({d: Work(self.epochs, config) for d in devices}, needed=len(devices))

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """FedNova over the steps each device reports; FedAvg if any did not report them."""
        self.samples.update({r.device_id: r.num_samples for r in results})
        updates, samples = [r.arrays for r in results], [r.num_samples for r in results]
        steps = [r.steps for r in results if r.steps is not None]
        if len(steps) < len(results):
            return fedavg(updates, samples)
        return fednova(current, updates, samples, steps)
