"""Differential privacy around a strategy, through the round loop with fake devices: epsilon in every round
record, equal to what dp-accounting gives composed round by round, training stopped before the budget is
passed; the wrapper on FedAvg and on FedProx, and refused around a strategy it cannot make private.
"""

import argparse

import numpy as np
import pytest

from fedspeech.coordinator.privacy.budget import epsilon_spent, noise_multiplier_for
from fedspeech.coordinator.strategies import Result, make_strategy
from fedspeech.coordinator.strategies.differential_privacy import DifferentiallyPrivate, PrivacySettings
from fedspeech.coordinator_command import add_parser, settings
from fedspeech.protocol import weights
from tests.helpers.fake_fleet import Fleet
from tests.unit.test_privacy_budget import independently

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox"])
def test_each_round_records_the_accountants_epsilon_and_training_stops_at_the_budget(
    tmp_path, caplog, strategy
):
    budget = (independently(2.0, 1.0, 3, 1e-5) + independently(2.0, 1.0, 4, 1e-5)) / 2  # room for 3 rounds
    privacy = {"dp_noise_multiplier": 2.0, "dp_norm_bound": 0.5, "dp_epsilon": budget}
    fleet = Fleet(tmp_path, rounds=10, strategy=strategy, **privacy)
    for device in "abc":
        fleet.device(device, value=1.0)
    fleet.finish()
    rounds = fleet.store.rounds()
    assert [r.round for r in rounds] == [0, 1, 2, 3], "no round past the budget"
    assert rounds[0].dp_epsilon is None
    for r in rounds[1:]:
        assert r.dp_epsilon == pytest.approx(independently(2.0, 1.0, r.round, 1e-5), rel=1e-9)
        assert r.dp_delta == 1e-5
    assert "the privacy budget is spent: round 4 would bring epsilon" in caplog.text
    stored = fleet.store.model_path(3, "weights").read_bytes()
    metadata = weights.decode(stored)[1]
    assert float(metadata["dp_epsilon"]) == rounds[3].dp_epsilon, "the model says what it cost"


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox"])
def test_one_device_moves_the_model_by_at_most_the_clip_over_the_expected_count_plus_noise(strategy):
    privacy = PrivacySettings(noise_multiplier=1e-2, norm_bound=0.1, sampling_rate=1.0)
    wrapped = make_strategy(strategy, 1, 1, privacy=privacy)
    plan = wrapped.configure_round(1, dict.fromkeys(["a", "b", "c", "d"]), np.random.default_rng(0))  # type: ignore[arg-type]
    assert sorted(plan.work) == ["a", "b", "c", "d"]
    if strategy == "fedprox":
        assert plan.work["a"].config == {"proximal_mu": 0.01}, "the wrapped strategy's plan, kept"
    current = {"w": np.zeros(2, np.float32)}
    results = [Result("a", {"w": np.full(2, 100.0, np.float32)}, 10_000)]  # far away, claiming many clips
    step = wrapped.aggregate(1, results, current)["w"]
    assert np.linalg.norm(step) < 0.1 / 4 + 5 * 1e-3 * np.sqrt(2), "clip / 4 expected devices, and noise"


def test_devices_are_sampled_at_the_rate():
    strategy = make_strategy("fedavg", 1, 1, privacy=PrivacySettings(sampling_rate=0.1))
    pool = dict.fromkeys(f"d{n}" for n in range(1000))
    counts = [len(strategy.configure_round(r, pool, np.random.default_rng(r)).work) for r in range(20)]  # type: ignore[arg-type]
    assert 80 < np.mean(counts) < 120


@pytest.mark.parametrize(
    ("strategy", "says"),
    [("median", "wraps a strategy that averages; median does not"), ("topk_only", "topk_only picks some")],
)
def test_privacy_refuses_a_strategy_whose_model_is_no_mean_or_that_picks_among_the_sampled(strategy, says):
    with pytest.raises(ValueError, match=says):
        make_strategy(strategy, 3, 1, privacy=PrivacySettings())


def test_the_dp_options_wrap_the_strategy_and_calibrate_the_noise_to_the_epsilon_over_the_rounds():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    add_parser(commands)
    args = parser.parse_args(
        ["coordinator", "--rounds", "30", "--dp-epsilon", "8", "--dp-sampling-rate", "0.1"]
    )
    rounds = settings(args, {})[0].rounds
    assert rounds.strategy == "fedavg" and rounds.privacy is not None and rounds.privacy.epsilon == 8
    z = rounds.privacy.noise_multiplier
    assert z == pytest.approx(noise_multiplier_for(8, 1e-5, 0.1, 30))
    assert epsilon_spent(z, 0.1, 30, 1e-5) <= 8 < epsilon_spent(z * 0.98, 0.1, 30, 1e-5)
    strategy = make_strategy("fedavg", 1, 1, privacy=rounds.privacy)
    assert strategy.privacy_after(30).past_budget(30) is None  # type: ignore[union-attr]
    assert strategy.privacy_after(31).past_budget(31) is not None  # type: ignore[union-attr]
    given = settings(
        parser.parse_args(["coordinator", "--dp-epsilon", "8", "--dp-noise-multiplier", "2"]), {}
    )
    assert given[0].rounds.privacy.noise_multiplier == 2.0, "a multiplier given is kept, epsilon its budget"  # type: ignore[union-attr]


def test_the_norm_bound_quantile_option_makes_the_bound_adapt():
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["coordinator", "--dp-noise-multiplier", "1", "--dp-norm-bound-quantile", "0.5"])
    privacy = settings(args, {})[0].rounds.privacy
    assert privacy == PrivacySettings(noise_multiplier=1.0, norm_bound_quantile=0.5)
    strategy = make_strategy("fedavg", 1, 1, privacy=privacy)
    assert isinstance(strategy, DifferentiallyPrivate)
    strategy.configure_round(1, dict.fromkeys("abc"), np.random.default_rng(0))  # type: ignore[arg-type]
    terms = strategy.secure_terms()
    assert terms.count_scale > 0 and terms.on_count is not None, "under secure aggregation, devices count"
