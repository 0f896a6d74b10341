"""Epsilon per round and the noise a budget allows, against dp-accounting used directly."""

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from fedspeech.coordinator.privacy.budget import (
    PrivacySettings,
    epsilon_spent,
    next_round_allowed,
    noise_multiplier_for,
)


def independently(noise_multiplier: float, sampling_rate: float, rounds: int, delta: float) -> float:
    """The same figure, composed round by round with the library's own events."""
    accountant = RdpAccountant()
    for _ in range(rounds):
        gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
        accountant.compose(
            gaussian if sampling_rate == 1 else dp_accounting.PoissonSampledDpEvent(sampling_rate, gaussian)
        )
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize(
    ("noise_multiplier", "sampling_rate", "rounds"), [(1.0, 1.0, 30), (1.1, 0.06, 20), (4.0, 1.0, 5)]
)
def test_epsilon_after_each_round_is_the_accountants(noise_multiplier, sampling_rate, rounds):
    spent = [
        epsilon_spent(noise_multiplier, sampling_rate, r, 1e-5)
        for r in sorted({0, 1, 2, rounds // 2, rounds})
    ]
    assert spent[0] == 0.0
    assert spent[-1] == pytest.approx(independently(noise_multiplier, sampling_rate, rounds, 1e-5), rel=1e-9)
    assert all(a < b for a, b in zip(spent[1:], spent[2:], strict=False))  # every round costs


def test_sampling_at_random_spends_less_than_picking():
    assert epsilon_spent(1.0, 0.06, 50, 1e-5) < epsilon_spent(1.0, 1.0, 50, 1e-5) / 4


def test_the_noise_for_a_budget_spends_it_and_no_more():
    z = noise_multiplier_for(8.0, 1e-5, 1.0, 30)
    assert epsilon_spent(z, 1.0, 30, 1e-5) <= 8.0
    assert epsilon_spent(z * 0.98, 1.0, 30, 1e-5) > 8.0  # barely less noise is over the budget


def test_training_stops_at_the_budget():
    settings = PrivacySettings(noise_multiplier=1.0, clip=1.0, delta=1e-5, epsilon_budget=20.0)
    allowed = [next_round_allowed(settings, 1.0, done) for done in range(20)]
    stop = allowed.index(False)
    assert all(allowed[:stop]) and not any(allowed[stop:])
    assert epsilon_spent(1.0, 1.0, stop, 1e-5) <= 20.0 < epsilon_spent(1.0, 1.0, stop + 1, 1e-5)
    assert next_round_allowed(PrivacySettings(1.0, 1.0, 1e-5), 1.0, 10_000)  # no budget: never stops


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": 0.0}, "noise multiplier"),
        ({"clip": -1.0}, "clip"),
        ({"delta": 0.5}, "delta"),
        ({"epsilon_budget": 0.0}, "budget"),
    ],
)
def test_settings_out_of_bounds_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrivacySettings(**({"noise_multiplier": 1.0, "clip": 1.0, "delta": 1e-5} | kwargs))


def test_a_sampling_rate_out_of_bounds_is_refused():
    with pytest.raises(ValueError, match="sampling rate"):
        epsilon_spent(1.0, 1.5, 3, 1e-5)
