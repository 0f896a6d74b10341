"""Bounded influence: the samples an update counts for, its change's norm, a device's evaluation counts."""

import math
from dataclasses import replace

import numpy as np
import pytest

from fedspeech.coordinator.config import RoundConfig, norm_bound_value
from fedspeech.coordinator.round.evaluation import check_counts
from fedspeech.coordinator.round.influence import (
    SampleLimits,
    fleet_median,
    norm_bounded,
    norm_limit,
    sample_ceiling,
)
from fedspeech.coordinator.strategies import Result
from fedspeech.coordinator.strategies.aggregate import fedavg, update_norms
from fedspeech.protocol import messages
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import DeviceStatus, Profile, Registration
from tests.helpers.fake_fleet import Fleet, profile

LIMITS = SampleLimits(growth=0.25, over_median=3.0, most=100_000)


def test_a_device_counts_for_no_more_than_it_registered_nor_the_operators_cap():
    assert sample_ceiling(360, None, None, LIMITS) == 360
    assert sample_ceiling(360, None, None, SampleLimits(0.25, 3.0, most=200)) == 200
    assert sample_ceiling(0, None, 360.0, LIMITS) == 0, "a device that registered no clips counts for none"


def test_a_claim_of_100000_samples_counts_for_a_small_multiple_of_the_median_reached_slowly():
    registered = {"a": 360, "b": 350, "c": 370, "d": 340, "liar": 100_000}
    median = fleet_median(registered, {})
    assert median == 360.0, "one liar does not move the median"
    first = sample_ceiling(100_000, None, median, LIMITS)
    assert first == 3 * 360
    # once it counted for 360, it may grow by a quarter a round, never past 3 x the median
    ceilings, last = [], 360
    for _ in range(8):
        last = min(100_000, sample_ceiling(100_000, last, median, LIMITS))
        ceilings.append(last)
    assert ceilings[:3] == [450, 563, 704] and max(ceilings) == 1080


def test_the_fleet_median_stands_on_what_devices_last_counted_for_and_skips_the_empty():
    registered = {"a": 10, "b": 30, "c": 0, "d": 100_000}
    assert fleet_median(registered, {"d": 40}) == 30.0, "d's registration is not what it counted for"
    assert fleet_median({"a": 0}, {}) is None
    assert sample_ceiling(50, None, None, LIMITS) == 50, "no median yet: no bound from it"


def test_an_update_may_shrink_at_once_and_grow_by_at_least_one_sample():
    assert sample_ceiling(5, 400, 400.0, LIMITS) == 5
    assert sample_ceiling(100, 1, 100.0, LIMITS) == 2, "ceil(1.25): a device with one clip can still grow"


START = {"w": np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4), "b": np.ones(2, np.float32)}


def honest_updates(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    step = {k: rng.normal(0, 0.05, a.shape) for k, a in START.items()}
    return [
        {k: (a + step[k] + rng.normal(0, 0.01, a.shape)).astype(np.float32) for k, a in START.items()}
        for _ in range(n)
    ]


def distance(a: dict, b: dict) -> float:
    return math.sqrt(sum(float(np.sum((a[k].astype(np.float64) - b[k]) ** 2)) for k in a))


def test_the_norm_bound_keeps_fedavg_near_the_honest_mean_against_minus_three_times_the_global_model():
    # the compromised device's update: -3 x the global weights, counting for 3 x the median of 5 honest
    honest = honest_updates(5)
    attack = {k: (-3 * a).astype(np.float32) for k, a in START.items()}
    results = [Result(f"h{i}", u, 360) for i, u in enumerate(honest)] + [Result("liar", attack, 1080)]
    honest_mean = fedavg(honest, [360] * 5)
    step = distance(honest_mean, START)

    def aggregated(setting: str) -> dict:
        bounded, _ = norm_bounded(START, results, setting, 2.0)
        return fedavg([r.arrays for r in bounded], [r.num_samples for r in bounded])

    assert distance(aggregated("off"), honest_mean) > 10 * step, "without the bound the liar owns the model"
    assert distance(aggregated("median"), honest_mean) < 1.0 * step
    assert distance(aggregated(0.4), honest_mean) < 1.0 * step, "a fixed bound twice the honest norms"


def test_the_norm_bound_leaves_changes_within_it_untouched_and_says_which_it_shortened():
    honest = honest_updates(4, seed=1)
    big = {k: (a + 10 * (honest[0][k] - a)).astype(np.float32) for k, a in START.items()}
    results = [Result(f"h{i}", u, 10) for i, u in enumerate([*honest, big])]
    norms = update_norms(START, [r.arrays for r in results])
    bounded, shortened = norm_bounded(START, results, "median", 2.0)
    limit = 2.0 * float(np.median(norms))
    assert [s.device_id for s in shortened] == ["h4"] and shortened[0].bound == pytest.approx(limit)
    assert all(b is r for b, r in zip(bounded[:4], results[:4], strict=True)), "passed on as they came"
    assert update_norms(START, [bounded[4].arrays]) == [pytest.approx(limit, rel=1e-5)]
    assert bounded[4].num_samples == 10 and bounded[4].device_id == "h4"


def test_a_change_that_is_not_finite_is_left_for_the_aggregation_to_drop():
    honest = honest_updates(3, seed=2)
    broken = {k: np.full_like(a, np.nan) for k, a in START.items()}
    results = [Result(f"h{i}", u, 10) for i, u in enumerate([*honest, broken])]
    bounded, shortened = norm_bounded(START, results, "median", 2.0)
    assert shortened == [] and bounded[3] is results[3]
    assert norm_limit("median", 2.0, [1.0, math.nan, 3.0, math.inf]) == pytest.approx(4.0)
    assert norm_limit(5.0, 2.0, [1.0, 30.0]) == 5.0
    assert norm_limit("off", 2.0, [1.0]) is None and norm_limit("median", 2.0, [math.nan]) is None


@pytest.mark.parametrize("setting", ["", "0", "-1", "nan", "inf", "mean", "1e999"])
def test_a_norm_bound_setting_is_median_off_or_a_positive_number(setting):
    with pytest.raises(ValueError, match="norm_bound must be median, off or a positive number"):
        norm_bound_value(setting)
    with pytest.raises(ValueError, match="norm_bound must be median, off or a positive number"):
        RoundConfig(norm_bound=setting)  # type: ignore[arg-type]
    assert norm_bound_value("2.5") == 2.5 and norm_bound_value("off") == "off"
    assert RoundConfig(norm_bound=2.5).norm_bound == 2.5


@pytest.mark.parametrize(
    "setting", [{"norm_bound_factor": 0.5}, {"sample_growth": -0.1}, {"samples_over_median": 0.9}]
)
def test_the_influence_settings_are_bounded(setting):
    with pytest.raises(ValueError, match=next(iter(setting))):
        RoundConfig(**setting)


LABELS = ["0", "1", "_none_"]


def test_an_evaluation_report_within_the_registered_test_counts_passes_and_one_beyond_is_refused():
    confusion = np.array([[4, 1, 0], [0, 5, 0], [0, 0, 0]])
    check_counts(confusion, LABELS, {"0": 5, "1": 6})
    with pytest.raises(ValueError, match=r"more test clips than the device registered \(1: 5 of 4\)"):
        check_counts(confusion, LABELS, {"0": 5, "1": 4})
    faked = np.diag([10**9, 10**9, 0])
    with pytest.raises(ValueError, match="0: 1000000000 of 5, 1: 1000000000 of 6"):
        check_counts(faked, LABELS, {"0": 5, "1": 6})
    with pytest.raises(ValueError, match="_none_: 1 of 0"):
        check_counts(np.array([[0, 0, 0], [0, 0, 0], [0, 0, 1]]), LABELS, {"0": 5, "1": 6})


def test_a_registration_with_counts_out_of_bounds_is_refused():
    good = Registration("d", 40, Profile(1, 0.0, 256.0), {"0": 5, "_none_": 0})
    assert messages.decode(messages.encode(good), Registration) == good
    for counts in ({"0": -1}, {"0": 10**12}, {"../x": 1}):
        with pytest.raises(ProtocolError, match="bad count"):
            messages.decode(messages.encode(replace(good, test_counts=counts)), Registration)


def test_an_unsigned_status_never_sets_a_weight(tmp_path):
    # a stranger on an open broker publishes statuses claiming 1 sample for one device, 10**6 for another
    fleet = Fleet(tmp_path, rounds=1, min_devices=2)
    fleet.device("a", value=1.0, samples=30)
    fleet.device("b", value=3.0, samples=10)
    fleet.link.statuses_["a"] = DeviceStatus("a", "online", 1, profile(1.0))
    fleet.link.statuses_["b"] = DeviceStatus("b", "online", 10**6, profile(1.0))
    fleet.finish()
    assert {u.device_id: u.num_samples for u in fleet.store.updates(1)} == {"a": 30, "b": 10}
    assert fleet.store.rounds()[1].accuracy == pytest.approx((1 * 30 + 3 * 10) / 40)
