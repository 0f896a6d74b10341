"""User-level differential privacy's bookkeeping (McMahan et al. 2018, "Learning Differentially Private
Recurrent Language Models"): epsilon spent after each round, from Google's dp-accounting (Rényi DP), and
the noise multiplier a budget allows.

A round's aggregate is a Gaussian mechanism: every update clipped to norm `clip`, noise of standard
deviation noise_multiplier * clip on their sum. Privacy is amplified by sampling only when devices are
drawn uniformly at random (a round of K devices out of N then counts as Poisson sampling at K/N); a device
picked by its hardware, its quality or its turn is not drawn at random, and such a round counts at 1.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import dp_accounting
from dp_accounting.rdp import RdpAccountant

MAX_NOISE_MULTIPLIER = 1000.0


@dataclass(frozen=True)
class PrivacySettings:
    """What the operator asked for: the noise, the clip, delta, and the budget at which training stops."""

    noise_multiplier: float
    clip: float
    delta: float
    epsilon_budget: float | None = None  # None: account, never stop

    def __post_init__(self) -> None:
        if not 0 < self.noise_multiplier <= MAX_NOISE_MULTIPLIER:
            raise ValueError(
                f"the noise multiplier must be in (0, {MAX_NOISE_MULTIPLIER:g}], not {self.noise_multiplier}"
            )
        if not 0 < self.clip <= 1000:
            raise ValueError(f"the clip must be in (0, 1000], not {self.clip}")
        if not 0 < self.delta < 0.1:
            raise ValueError(f"delta must be in (0, 0.1), not {self.delta}")
        if self.epsilon_budget is not None and not self.epsilon_budget > 0:
            raise ValueError(f"the epsilon budget must be positive, not {self.epsilon_budget}")


def _round_event(noise_multiplier: float, sampling_rate: float) -> dp_accounting.DpEvent:
    """One round: the Gaussian mechanism, Poisson-sampled when devices are drawn at random."""
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"a sampling rate is in (0, 1], not {sampling_rate}")
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    return gaussian if sampling_rate == 1 else dp_accounting.PoissonSampledDpEvent(sampling_rate, gaussian)


def epsilon_spent(noise_multiplier: float, sampling_rate: float, rounds: int, delta: float) -> float:
    """Epsilon at delta after `rounds` rounds (0 before the first)."""
    if rounds < 0:
        raise ValueError(f"rounds cannot be negative, not {rounds}")
    if rounds == 0:
        return 0.0
    accountant = RdpAccountant()
    with _quiet_accountant():  # composing computes the Rényi orders, and warns of those it leaves out
        accountant.compose(
            dp_accounting.SelfComposedDpEvent(_round_event(noise_multiplier, sampling_rate), rounds)
        )
        return float(accountant.get_epsilon(delta))


def noise_multiplier_for(epsilon: float, delta: float, sampling_rate: float, rounds: int) -> float:
    """The smallest noise multiplier with which `rounds` rounds spend at most epsilon at delta."""
    if not epsilon > 0 or rounds < 1:
        raise ValueError(f"need a positive epsilon and at least one round, not {epsilon} and {rounds}")

    def event(noise_multiplier: float) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(_round_event(noise_multiplier, sampling_rate), rounds)

    with _quiet_accountant():
        return float(
            dp_accounting.calibrate_dp_mechanism(
                RdpAccountant,
                event,
                epsilon,
                delta,
                dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
                tol=1e-4,
            )
        )


def next_round_allowed(settings: PrivacySettings, sampling_rate: float, rounds_done: int) -> bool:
    """Whether one more round keeps epsilon within the budget (always, without a budget)."""
    if settings.epsilon_budget is None:
        return True
    after = epsilon_spent(settings.noise_multiplier, sampling_rate, rounds_done + 1, settings.delta)
    return after <= settings.epsilon_budget


@contextmanager
def _quiet_accountant() -> Iterator[None]:
    """Hold back the accountant's warnings about Rényi orders it leaves out (it says so through absl)."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
