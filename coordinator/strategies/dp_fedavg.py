"""DP-FedAvg (McMahan et al. 2018, "Learning Differentially Private Recurrent Language Models"):
user-level differential privacy on the coordinator. Each device is taken into a round with probability
`sampling_rate` (Poisson sampling, which the privacy accountant's amplification assumes), each update's
change is clipped to norm `clip`, and Gaussian noise of noise_multiplier * clip is added to their sum,
divided by the expected number of devices. Epsilon after each round comes from dp-accounting; training
stops before a round that would spend more than `epsilon` (0: no budget).

With secure aggregation the devices clip their own changes and add the noise in parts, each a share of
its variance, so that nobody ever sees the sum without it: the coordinator then only divides.

With a target quantile the clip adapts (Andrew et al. 2021, "Differentially Private Learning with Adaptive
Clipping"): each round counts, with noise, the changes within the clip, and the next clip steps
geometrically towards the norm that the target share of changes stay within. The count's noise takes part
of the privacy the noise multiplier gives: the changes get a little more noise, and epsilon is the same.
Under secure aggregation each device adds its +1/2 or -1/2 to the sum after its change, scaled so that the
sum's noise is the count's.
"""

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedspeech.coordinator.aggregate import (
    adapted_clip,
    change_noise_multiplier,
    count_noise,
    dp_mean,
    stepped_norms,
)
from fedspeech.coordinator.privacy_budget import epsilon_spent, noise_multiplier_for
from fedspeech.coordinator.strategies.base import (
    PrivacySpent,
    Result,
    RoundPlan,
    SecureTerms,
    Strategy,
    Work,
)
from fedspeech.coordinator.strategies.params import StrategyParams, setting
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)


CLIP_RANGE = (1e-6, 1000.0)  # where an adapting clip stays: the clip setting's bounds


class DPFedAvg(Strategy):
    """Devices sampled at a fixed rate, their changes clipped and summed with Gaussian noise."""

    name = "dp_fedavg"

    @dataclass(frozen=True)
    class Params(StrategyParams):
        """DP-FedAvg's settings."""

        noise_multiplier: float = setting(1.0, 0.01, 1000.0, "the noise's deviation, as a multiple of clip")
        clip: float = setting(1.0, *CLIP_RANGE, "the L2 norm each device's change is clipped to")
        delta: float = setting(1e-5, 1e-12, 0.09, "the delta epsilon is spent at")
        epsilon: float = setting(0.0, 0.0, 1e6, "the budget: no round past it (0: none)")
        sampling_rate: float = setting(1.0, 1e-4, 1.0, "each device's chance of being in a round")
        target_quantile: float = setting(
            0.0, 0.0, 1.0, "the share of changes the clip adapts to hold unclipped (0: a fixed clip)"
        )
        clip_learning_rate: float = setting(0.2, 0.01, 10.0, "how far the clip steps each round, adapting")

    params: Params

    def __init__(self, k: int, epochs: int, params: StrategyParams | None = None) -> None:
        super().__init__(k, epochs, params)
        self._expected = 1.0  # devices a round expects: its denominator, whoever answers
        self._noise = np.random.default_rng()  # fresh entropy: noise no one can replay from a seed
        self.clip = self.params.clip  # the round's clip: the setting, or where adapting has taken it
        self._next_clip = self.clip

    def configure_round(self, round: int, pool: Mapping[str, Profile], rng: np.random.Generator) -> RoundPlan:
        """Each device of the pool with probability sampling_rate, for the configured epochs."""
        rate = self.params.sampling_rate
        chosen = [d for d in sorted(pool) if rng.random() < rate]
        self._expected = max(rate * len(pool), 1.0)
        self.clip = self._next_clip
        return RoundPlan({d: Work(self.epochs) for d in chosen}, needed=len(chosen))

    def aggregate(self, round: int, results: Sequence[Result], current: Arrays) -> Arrays:
        """The clipped changes' sum with noise, over the expected number of devices, onto current."""
        p, updates = self.params, [r.arrays for r in results]
        if not p.target_quantile:
            return dp_mean(current, updates, self.clip, p.noise_multiplier, self._expected, self._noise)
        deviation = count_noise(self._expected, p.noise_multiplier)
        changes = change_noise_multiplier(p.noise_multiplier, deviation)
        within = sum(norm <= self.clip for norm in stepped_norms(current, updates)) - len(updates) / 2
        self.clip_count(round, within + self._noise.normal(0.0, deviation))
        return dp_mean(current, updates, self.clip, changes, self._expected, self._noise)

    def secure_terms(self) -> SecureTerms:
        """Under secure aggregation: changes clipped and noised on the devices, summed alike, divided by
        the expected count; adapting, each device's +1/2 or -1/2 after its change, scaled so that the
        sum's noise on it is the count's.
        """
        p = self.params
        scale = 0.0
        if p.target_quantile:
            deviation = count_noise(self._expected, p.noise_multiplier)
            scale = change_noise_multiplier(p.noise_multiplier, deviation) * self.clip / deviation
        return SecureTerms(self.clip, p.noise_multiplier, False, self._expected, count_scale=scale)

    def clip_count(self, round: int, within: float) -> None:
        """The next round's clip, from this round's noised count of changes within the clip (each +1/2,
        each past it -1/2), where the clip adapts.
        """
        p = self.params
        if not p.target_quantile:
            return
        new = adapted_clip(self.clip, within, self._expected, p.target_quantile, p.clip_learning_rate)
        self._next_clip = min(max(new, CLIP_RANGE[0]), CLIP_RANGE[1])
        log.info(
            "round %d: about %.0f%% of the changes within the clip %.4g (noised); the next clip is %.4g",
            round, 100 * (within / self._expected + 0.5), self.clip, self._next_clip,
        )  # fmt: skip

    def privacy_after(self, rounds: int) -> PrivacySpent:
        """Epsilon at delta once `rounds` rounds are aggregated, from the accountant."""
        p = self.params
        return PrivacySpent(epsilon_spent(p.noise_multiplier, p.sampling_rate, rounds, p.delta), p.delta)

    def stop_before(self, round: int) -> str | None:
        """Why round may not train: it would spend more than the budget."""
        budget = self.params.epsilon
        after = self.privacy_after(round).epsilon
        if budget and after > budget:
            return (
                f"the privacy budget is spent: round {round} would bring epsilon to {after:.3g}, past "
                f"{budget:g} at delta {self.params.delta:g}; training stops, round {round - 1}'s model stays"
            )
        return None


def calibrated(options: Mapping[str, float], rounds: int) -> dict[str, float]:
    """DP-FedAvg's options with the least noise multiplier that keeps `rounds` rounds within their
    epsilon, where they give an epsilon and no multiplier; as they are otherwise.
    """
    if "noise_multiplier" in options or not options.get("epsilon"):
        return dict(options)
    p = DPFedAvg.Params(**{name: float(value) for name, value in options.items()})
    noise = noise_multiplier_for(p.epsilon, p.delta, p.sampling_rate, rounds)
    return {**options, "noise_multiplier": noise}
