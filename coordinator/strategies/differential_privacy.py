"""User-level differential privacy around a strategy whose new model is a weighted mean of the changes:
DP-FedAvg's mechanism (McMahan et al. 2018, "Learning Differentially Private Recurrent Language Models"),
as Flower's server-side DP wraps any strategy.

Each device of the pool is offered to the wrapped strategy with probability `sampling_rate` (Poisson
sampling, which the accountant's amplification assumes: the strategy must train every device it is
offered), each update's change is bounded (clipped) to the L2 norm `norm_bound` and weighted alike (a
weight by its clips would let one device move the model by more than the bound), and Gaussian noise of
noise_multiplier * norm_bound is added to their sum, divided by the expected number of devices. The
wrapped strategy keeps its plan (FedProx's mu, say); its weights give way to equal ones. Epsilon after
each round comes from dp-accounting; no round trains that would spend more than `epsilon` (0: no budget).

With secure aggregation the devices bound their own changes and add the noise in parts, each a share of
its variance, so that nobody ever sees the sum without it: the coordinator then only divides.

With a target quantile, `norm_bound_quantile`, the bound adapts (Andrew et al. 2021, "Differentially
Private Learning with Adaptive Clipping"): each round counts, with noise, the changes within the bound,
and the next bound steps geometrically towards the norm that the target share of changes stay within.
The count's noise takes part of the privacy the noise multiplier gives: the changes get a little more
noise, and epsilon is the same. Under secure aggregation each device adds its +1/2 or -1/2 to the sum
after its change, scaled so that the sum's noise is the count's.
"""

import logging
import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np

from fedspeech.coordinator.privacy.budget import epsilon_spent, noise_multiplier_for
from fedspeech.coordinator.strategies.aggregate import stepped, stepped_norms
from fedspeech.coordinator.strategies.base import (
    PrivacySpent,
    Result,
    RoundPlan,
    SecureTerms,
    ServerSide,
    Strategy,
)
from fedspeech.coordinator.strategies.params import StrategyParams, setting
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)

CLIP_RANGE = (1e-6, 1000.0)  # where an adapting clip stays: the clip setting's bounds
PROBE = 4  # devices offered to a strategy, to see that it trains every one (see wrap)


@dataclass(frozen=True)
class PrivacySettings(StrategyParams):
    """Differential privacy's settings: each is `--dp-NAME` and the config key `dp_NAME`."""

    noise_multiplier: float = setting(
        1.0, 0.01, 1000.0, "the noise's deviation, as a multiple of the norm bound"
    )
    norm_bound: float = setting(1.0, *CLIP_RANGE, "the L2 norm each device's change is bounded to")
    delta: float = setting(1e-5, 1e-12, 0.09, "the delta epsilon is spent at")
    epsilon: float = setting(0.0, 0.0, 1e6, "the budget: no round past it (0: none)")
    sampling_rate: float = setting(1.0, 1e-4, 1.0, "each device's chance of being in a round")
    norm_bound_quantile: float = setting(
        0.0, 0.0, 1.0, "the share of changes the bound adapts to hold within it (0: a fixed bound)"
    )
    norm_bound_learning_rate: float = setting(0.2, 0.01, 10.0, "how far the bound steps each round, adapting")


def privacy_settings(given: Mapping[str, float], rounds: int) -> PrivacySettings | None:
    """The settings given (None: no differential privacy), with the least noise multiplier that keeps
    `rounds` rounds within their epsilon where they give an epsilon and no multiplier.
    """
    if not given:
        return None
    if "noise_multiplier" not in given and given.get("epsilon"):
        p = PrivacySettings(**given)
        noise = noise_multiplier_for(p.epsilon, p.delta, p.sampling_rate, rounds)
        given = {**given, "noise_multiplier": noise}
    return PrivacySettings(**given)


class DifferentiallyPrivate(Strategy):
    """The wrapped strategy's plan on a Poisson sample of the devices; their changes clipped, weighted
    alike and summed with Gaussian noise.
    """

    Params = PrivacySettings
    params: PrivacySettings

    def __init__(self, inner: Strategy, params: PrivacySettings) -> None:
        super().__init__(inner.k, inner.epochs, params)
        if inner.secure_terms() is None:  # its new model is not a weighted mean of the updates
            raise ValueError(f"differential privacy wraps a strategy that averages; {inner.name} does not")
        probe = dict.fromkeys((f"probe-{n}" for n in range(PROBE)), Profile(1, 0.0, 0.0))  # unmeasured
        plan = inner.configure_round(1, probe, np.random.default_rng(0))
        if len(plan.work) < PROBE or plan.needed < PROBE:
            raise ValueError(
                f"differential privacy needs a strategy that trains every device it is offered (the "
                f"accountant's sampling); {inner.name} picks some, or aggregates the first few"
            )
        self.inner, self.name, self.needs, self.personal = inner, inner.name, inner.needs, inner.personal
        self._expected = 1.0  # devices a round expects: its denominator, whoever answers
        self._noise = np.random.default_rng()  # fresh entropy: noise no one can replay from a seed
        self.clip = params.norm_bound  # the round's clip: the setting, or where adapting has taken it
        self._next_clip = self.clip

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """The wrapped strategy's plan for each device of the pool taken with probability sampling_rate."""
        rate = self.params.sampling_rate
        sampled = {d: pool[d] for d in sorted(pool) if rng.random() < rate}
        self._expected = max(rate * len(pool), 1.0)
        self.clip = self._next_clip
        return self.inner.configure_round(round, sampled, rng)

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """The clipped changes' sum with noise, over the expected number of devices, onto current."""
        p, updates = self.params, [r.arrays for r in results]
        if not p.norm_bound_quantile:
            return dp_mean(current, updates, self.clip, p.noise_multiplier, self._expected, self._noise)
        deviation = count_noise(self._expected, p.noise_multiplier)
        changes = change_noise_multiplier(p.noise_multiplier, deviation)
        within = sum(norm <= self.clip for norm in stepped_norms(current, updates)) - len(updates) / 2
        self._adapt(round, within + self._noise.normal(0.0, deviation))
        return dp_mean(current, updates, self.clip, changes, self._expected, self._noise)

    def secure_terms(self) -> SecureTerms:
        """Under secure aggregation: changes clipped and noised on the devices, summed alike, divided by
        the expected count; adapting, each device's +1/2 or -1/2 after its change, scaled so that the
        sum's noise on it is the count's, and the count comes back to adapt the clip.
        """
        p = self.params
        if not p.norm_bound_quantile:
            return SecureTerms(self.clip, p.noise_multiplier, False, self._expected)
        deviation = count_noise(self._expected, p.noise_multiplier)
        scale = change_noise_multiplier(p.noise_multiplier, deviation) * self.clip / deviation
        return SecureTerms(self.clip, p.noise_multiplier, False, self._expected, scale, self._adapt)

    def _adapt(self, round: int, within: float) -> None:
        """The next round's clip, from this round's noised count of changes within the clip (each +1/2,
        each past it -1/2).
        """
        p = self.params
        new = adapted_clip(
            self.clip, within, self._expected, p.norm_bound_quantile, p.norm_bound_learning_rate
        )
        self._next_clip = min(max(new, CLIP_RANGE[0]), CLIP_RANGE[1])
        log.info(
            "round %d: about %.0f%% of the changes within the norm bound %.4g (noised); the next is %.4g",
            round, 100 * (within / self._expected + 0.5), self.clip, self._next_clip,
        )  # fmt: skip

    def privacy_after(self, rounds: int) -> PrivacySpent:
        """Epsilon at delta once `rounds` rounds are aggregated, from the accountant, and the budget."""
        p = self.params
        epsilon = epsilon_spent(p.noise_multiplier, p.sampling_rate, rounds, p.delta)
        return PrivacySpent(epsilon, p.delta, p.epsilon or None)

    def after_aggregate(self, round: int, new: Arrays, server: ServerSide) -> Arrays | None:
        """The wrapped strategy's second model, if it keeps one."""
        return self.inner.after_aggregate(round, new, server)

    def restore(self, teacher: Arrays) -> None:
        """The wrapped strategy's second model, after a restart."""
        self.inner.restore(teacher)

    def on_round_end(
        self, round: int, plan: RoundPlan, on_time: Set[str], deadline_missed: bool, aggregated: Sequence[str]
    ) -> None:
        """The wrapped strategy's bookkeeping."""
        self.inner.on_round_end(round, plan, on_time, deadline_missed, aggregated)


def dp_mean(
    current: Arrays,
    updates: Sequence[Arrays],
    clip: float,
    noise_multiplier: float,
    expected: float,
    rng: np.random.Generator,
) -> Arrays:
    """User-level DP-FedAvg's step (McMahan et al. 2018, "Learning Differentially Private Recurrent
    Language Models"): each update's change from current clipped to norm clip and weighted alike, summed,
    Gaussian noise of standard deviation noise_multiplier * clip added to every stepped weight, divided by
    the expected number of devices, not the number that came: so one device changes the step by at most
    clip / expected, whether it took part or not. Arrays that training does not step are averaged.
    """
    if not updates or not expected > 0 or not noise_multiplier >= 0:
        raise ValueError("need updates, a positive expected count and a noise multiplier of at least 0")
    names = [name for name, array in current.items() if stepped(name, array)]
    total = {name: np.zeros(current[name].shape) for name in names}
    for update, norm in zip(updates, stepped_norms(current, updates), strict=True):
        change = {name: update[name].astype(np.float64) - current[name] for name in names}
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        for name in names:
            total[name] += scale * change[name]
    step = {name: np.mean([u[name] for u in updates], axis=0).astype(a.dtype) for name, a in current.items()}
    for name in names:
        noise = rng.normal(0.0, noise_multiplier * clip, current[name].shape)
        step[name] = (current[name] + (total[name] + noise) / expected).astype(current[name].dtype)
    return step


# Adaptive clipping (Andrew et al. 2021, "Differentially Private Learning with Adaptive Clipping"): the clip
# follows a quantile of the changes' norms, learnt from a noised count of the changes within it.


def count_noise(expected: float, noise_multiplier: float) -> float:
    """The deviation of the noise on a round's count of changes within the clip: the paper's expected / 20,
    and at least the noise multiplier, so that the changes' own noise grows by 1 / sqrt(3/4) at most.
    """
    return max(expected / 20, noise_multiplier)


def change_noise_multiplier(noise_multiplier: float, count_deviation: float) -> float:
    """The changes' noise multiplier with which they and a count noised at count_deviation are together
    one Gaussian mechanism of noise_multiplier (each device counts +1/2 within the clip, -1/2 past it).
    """
    if not 0 < noise_multiplier < 2 * count_deviation:
        raise ValueError(f"the count's noise {count_deviation} is too small for z {noise_multiplier}")
    return float((noise_multiplier**-2 - (2 * count_deviation) ** -2) ** -0.5)


def adapted_clip(clip: float, within: float, expected: float, target: float, learning_rate: float) -> float:
    """The next round's clip, stepped geometrically towards the target quantile of the changes' norms;
    within is the round's noised sum of +1/2 for each change within the clip and -1/2 for each past it.
    """
    fraction = within / expected + 0.5
    return clip * math.exp(-learning_rate * (fraction - target))
