"""Aggregation strategies on hand-computed cases, no network."""

import numpy as np
import pytest

from fedspeech.coordinator.strategies.aggregate import (
    cache_calibrated,
    change,
    fedavg,
    rebased,
    server_momentum,
    staleness_fair,
    staleness_weighted,
    weighted_average,
    without_breakers,
)


def test_fedavg_weights_by_samples():
    a = {"w": np.array([0.0, 4.0], np.float32), "b": np.array([1.0], np.float32)}
    b = {"w": np.array([4.0, 0.0], np.float32), "b": np.array([3.0], np.float32)}
    out = fedavg([a, b], [1, 3])
    np.testing.assert_allclose(out["w"], [3.0, 1.0])
    np.testing.assert_allclose(out["b"], [2.5])
    assert out["w"].dtype == np.float32


def test_equal_weights_give_the_mean_and_one_update_is_itself():
    rng = np.random.default_rng(0)
    ups = [{"w": rng.normal(size=(3, 4)).astype(np.float32)} for _ in range(5)]
    np.testing.assert_allclose(
        weighted_average(ups, [2.0] * 5)["w"], np.mean([u["w"] for u in ups], 0), rtol=1e-6
    )
    np.testing.assert_array_equal(fedavg(ups[:1], [7])["w"], ups[0]["w"])


@pytest.mark.parametrize(("n", "weights"), [(0, []), (2, [1.0]), (2, [0.0, 0.0]), (2, [1.0, -1.0])])
def test_bad_weights_are_refused(n, weights):
    ups = [{"w": np.zeros(2, np.float32)} for _ in range(n)]
    with pytest.raises(ValueError):
        weighted_average(ups, weights)


def test_server_momentum_adds_the_last_step_scaled_and_starts_again_when_the_model_changes():
    current = {"w": np.array([1.0, 1.0], np.float32), "n": np.array(5, np.int64)}
    aggregate = {"w": np.array([2.0, 0.0], np.float32), "n": np.array(7, np.int64)}
    new, velocity = server_momentum(current, aggregate, None, 0.5)
    np.testing.assert_allclose(new["w"], [2.0, 0.0])  # no velocity yet: the aggregate itself
    assert new["w"].dtype == np.float32 and new["n"] == 7 and "n" not in velocity
    later = {"w": np.array([3.0, 0.0], np.float32), "n": new["n"]}
    new, velocity = server_momentum(new, later, velocity, 0.5)
    np.testing.assert_allclose(velocity["w"], [1.0 + 0.5 * 1.0, 0.0 - 0.5 * 1.0])
    np.testing.assert_allclose(new["w"], [3.5, -0.5])
    grown = {"w": np.zeros(3, np.float32)}  # a deeper model: the old velocity no longer fits
    new, velocity = server_momentum(grown, {"w": np.ones(3, np.float32)}, velocity, 0.5)
    np.testing.assert_allclose(new["w"], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError):
        server_momentum(current, aggregate, None, 1.0)


def test_server_momentum_leaves_batchnorm_statistics_to_the_average():
    current = {"bn.running_var": np.ones(2, np.float32), "bn.weight": np.ones(2, np.float32)}
    velocity = {"bn.weight": np.full(2, 1.0)}
    aggregate = {"bn.running_var": np.full(2, 3.0, np.float32), "bn.weight": np.full(2, 2.0, np.float32)}
    new, velocity = server_momentum(current, aggregate, velocity, 0.5)
    np.testing.assert_allclose(new["bn.running_var"], [3.0, 3.0])
    np.testing.assert_allclose(new["bn.weight"], [2.5, 2.5])
    assert set(velocity) == {"bn.weight"}


def test_without_breakers_drops_only_the_results_that_break_the_rule_on_their_own():
    like = {"w": np.zeros(2, dtype=np.float32)}
    results = {"a": 1.0, "b": float("nan"), "c": 3.0, "d": "not a number"}

    def mean(names):
        return {"w": np.full(2, sum(results[n] for n in names) / len(names), dtype=np.float32)}

    combined, kept = without_breakers(mean, ["a", "c"], like)
    assert kept == ["a", "c"] and combined["w"].tolist() == [2.0, 2.0]
    combined, kept = without_breakers(mean, ["a", "b", "c", "d"], like)
    assert kept == ["a", "c"] and combined["w"].tolist() == [2.0, 2.0], "NaN and a raise are both dropped"
    assert without_breakers(mean, ["b", "d"], like) is None


def test_a_late_update_is_its_change_laid_onto_the_current_model_but_statistics_and_counters_as_sent():
    base = {"w": np.array([1.0, 1.0], np.float32), "bn.running_mean": np.zeros(2, np.float32)}
    update = {"w": np.array([2.0, 0.5], np.float32), "bn.running_mean": np.full(2, 3.0, np.float32)}
    current = {"w": np.array([10.0, 10.0], np.float32), "bn.running_mean": np.ones(2, np.float32)}
    base["n"], update["n"], current["n"] = np.array(1), np.array(7), np.array(4)
    out = rebased(update, base, current)
    np.testing.assert_allclose(out["w"], [11.0, 9.5])
    np.testing.assert_allclose(out["bn.running_mean"], [3.0, 3.0])
    assert int(out["n"]) == 7 and out["w"].dtype == np.float32
    with pytest.raises(ValueError):
        two = {"w": np.zeros(2, np.float32)}
        rebased({"w": np.zeros(3, np.float32)}, two, two)


def test_staleness_weighting_discounts_by_the_square_root_of_one_plus_the_rounds_late():
    on_time, late = {"w": np.array([0.0], np.float32)}, {"w": np.array([3.0], np.float32)}
    out = staleness_weighted([on_time, late], [10, 10], [0, 3])  # weights 10 and 10 / 2
    np.testing.assert_allclose(out["w"], [1.0])
    np.testing.assert_allclose(staleness_weighted([on_time, late], [10, 10], [0, 0])["w"], [1.5])
    with pytest.raises(ValueError):
        staleness_weighted([on_time, late], [10, 10], [0, -1])


def test_cache_calibration_is_fedavg_when_everyone_delivers_and_keeps_a_silent_device_in_the_step():
    current = {"w": np.array([1.0], np.float32), "bn.running_mean": np.array([9.0], np.float32)}
    a = {"w": np.array([2.0], np.float32), "bn.running_mean": np.array([1.0], np.float32)}
    b = {"w": np.array([5.0], np.float32), "bn.running_mean": np.array([3.0], np.float32)}
    cache = [({"w": np.array([7.0])}, 10), ({"w": np.array([-3.0])}, 30)]  # the last changes of a and b
    everyone = cache_calibrated(current, [a, b], [10, 30], [cache[0][0], cache[1][0]], cache)
    for name, expected in fedavg([a, b], [10, 30]).items():
        np.testing.assert_allclose(everyone[name], expected)
    assert everyone["w"].dtype == np.float32
    # b is silent: its last change (-3) is in the step by its samples, and a's new change (1) replaces
    # its cached one (7); the statistics are the FedAvg of the updates that came
    only_a = cache_calibrated(current, [a], [10], [cache[0][0]], cache)
    np.testing.assert_allclose(only_a["w"], [1.0 + (7 * 10 - 3 * 30) / 40 + (1 - 7)])
    np.testing.assert_allclose(only_a["bn.running_mean"], [1.0])
    # before anything is cached, or with a device new to the cache (a zero change in its mean): FedAvg
    np.testing.assert_allclose(cache_calibrated(current, [a, b], [10, 30], [None, None], [])["w"], [4.25])
    b_is_new = cache_calibrated(current, [a, b], [10, 30], [cache[0][0], None], cache[:1])
    np.testing.assert_allclose(b_is_new["w"], [4.25])
    assert change(current, a).keys() == {"w"} and change(current, a)["w"].dtype == np.float32
    with pytest.raises(ValueError):
        cache_calibrated(current, [a, b], [10], [None, None], cache)
    with pytest.raises(ValueError):
        cache_calibrated(current, [a], [10], [None], [({"w": np.array([1.0])}, 0)])


def test_staleness_fair_weighting_raises_a_device_by_one_plus_its_mean_staleness():
    on_time, late = {"w": np.array([0.0], np.float32)}, {"w": np.array([3.0], np.float32)}
    np.testing.assert_allclose(staleness_fair([on_time, late], [10, 10], [0.0, 1.0])["w"], [2.0])  # 10 : 20
    np.testing.assert_allclose(staleness_fair([on_time, late], [30, 10], [0.0, 0.0])["w"], [0.75])
    for bad in ([0.0, -0.5], [0.0, float("nan")], [0.0]):
        with pytest.raises(ValueError):
            staleness_fair([on_time, late], [10, 10], bad)
