"""DP-FedAvg through the round loop with fake devices: epsilon in every round record, equal to what
dp-accounting gives composed round by round, and training stopped before the budget is passed.
"""

import argparse

import numpy as np
import pytest

from fedspeech.coordinator.privacy_budget import epsilon_spent, noise_multiplier_for
from fedspeech.coordinator.strategies import Result, make_strategy
from fedspeech.coordinator.strategies.dp_fedavg import DPFedAvg, calibrated
from fedspeech.coordinator_command import add_parser, settings
from fedspeech.protocol import weights
from tests.helpers.fake_fleet import Fleet
from tests.unit.test_privacy_budget import independently

pytestmark = pytest.mark.timeout(30)


def test_each_round_records_the_accountants_epsilon_and_training_stops_at_the_budget(tmp_path, caplog):
    budget = (independently(2.0, 1.0, 3, 1e-5) + independently(2.0, 1.0, 4, 1e-5)) / 2  # room for 3 rounds
    options = {"noise_multiplier": 2.0, "clip": 0.5, "epsilon": budget}
    fleet = Fleet(tmp_path, rounds=10, strategy="dp_fedavg", strategy_options=options)
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


def test_one_device_moves_the_model_by_at_most_the_clip_over_the_expected_count_plus_noise(tmp_path):
    strategy = make_strategy("dp_fedavg", 1, 1, {"noise_multiplier": 1e-2, "clip": 0.1, "sampling_rate": 1.0})
    plan = strategy.configure_round(1, dict.fromkeys(["a", "b", "c", "d"]), np.random.default_rng(0))
    assert sorted(plan.work) == ["a", "b", "c", "d"]
    current = {"w": np.zeros(2, np.float32)}
    results = [Result("a", {"w": np.full(2, 100.0, np.float32)}, 10)]  # one device far away
    step = strategy.aggregate(1, results, current)["w"]
    assert np.linalg.norm(step) < 0.1 / 4 + 5 * 1e-3 * np.sqrt(2), "clip / 4 expected devices, and noise"


def test_devices_are_sampled_at_the_rate(tmp_path):
    strategy = make_strategy("dp_fedavg", 1, 1, {"sampling_rate": 0.1})
    pool = dict.fromkeys(f"d{n}" for n in range(1000))
    counts = [len(strategy.configure_round(r, pool, np.random.default_rng(r)).work) for r in range(20)]
    assert 80 < np.mean(counts) < 120


def test_the_dp_options_pick_dp_fedavg_and_calibrate_its_noise_to_the_epsilon_over_the_rounds():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    add_parser(commands)
    args = parser.parse_args(
        ["coordinator", "--rounds", "30", "--dp-epsilon", "8", "--dp-sampling-rate", "0.1"]
    )
    config = settings(args, {})[0]
    options = config.rounds.strategy_options
    assert config.rounds.strategy == "dp_fedavg" and options["epsilon"] == 8
    z = options["noise_multiplier"]
    assert z == pytest.approx(noise_multiplier_for(8, 1e-5, 0.1, 30))
    assert epsilon_spent(z, 0.1, 30, 1e-5) <= 8 < epsilon_spent(z * 0.98, 0.1, 30, 1e-5)
    strategy = DPFedAvg(1, 1, DPFedAvg.Params(**options))
    assert strategy.stop_before(30) is None and strategy.stop_before(31) is not None
    given = calibrated({"epsilon": 8, "noise_multiplier": 2.0}, 30)
    assert given["noise_multiplier"] == 2.0, "a noise multiplier given is kept, the epsilon its budget"


def test_the_clip_quantile_option_makes_the_clip_adapt():
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["coordinator", "--dp-noise-multiplier", "1", "--dp-clip-quantile", "0.5"])
    options = settings(args, {})[0].rounds.strategy_options
    assert options == {"noise_multiplier": 1.0, "target_quantile": 0.5}
    strategy = DPFedAvg(1, 1, DPFedAvg.Params(**options))
    strategy.configure_round(1, dict.fromkeys("abc"), np.random.default_rng(0))  # type: ignore[arg-type]
    assert strategy.secure_terms().count_scale > 0, "under secure aggregation, devices add their count"
