"""Strategies and their maths (selection, scheduling, aggregation) on hand-computed cases, no network."""

import dataclasses
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fedspeech.coordinator.strategies import (
    STRATEGIES,
    Result,
    RoundPlan,
    Strategy,
    Work,
    make_strategy,
    strategy_class,
    strategy_params,
)
from fedspeech.coordinator.strategies.aggregate import coordinate_median, fedavg, fednova, hardware_weighted
from fedspeech.coordinator.strategies.ca2fl import CACHE_ROUNDS
from fedspeech.coordinator.strategies.scheduling import adaptive_epochs, fixed_epochs, learning_rate_for_round
from fedspeech.coordinator.strategies.selection import (
    ScoreWeights,
    hardware_scores,
    select_all,
    select_random,
    select_top_k,
    update_penalties,
)
from fedspeech.protocol.messages import Profile

ONLY_CPU = ScoreWeights(cpu=1.0, ram=0.0, speed=0.0, latency=0.0)


def profile(gflops=None, ram=1000.0, seconds=None, rtt=None) -> Profile:
    return Profile(
        cpu_count=4,
        cpu_freq_mhz=1500.0,
        ram_available_mb=ram,
        cpu_gflops=gflops,
        seconds_per_sample=seconds,
        rtt_ms=rtt,
    )


def floored(linear: float) -> float:
    """The score floor: 0.05 + 0.95 * the weighted mean of the normalised metrics."""
    return 0.05 + 0.95 * linear


THREE = {
    "a": profile(gflops=1.0, seconds=0.01, rtt=10.0),
    "b": profile(gflops=2.0, seconds=0.02, rtt=20.0),
    "c": profile(gflops=3.0, seconds=0.04, rtt=30.0),
}


def test_scores_of_a_three_device_pool():
    # cpu:     1, 2, 3 gflops          -> 0, 0.5, 1
    # ram:     equal                   -> 1, 1, 1
    # speed:   1/T = 100, 50, 25       -> (v - 25) / 75 = 1, 1/3, 0
    # latency: 10, 20, 30 ms           -> 1, 0.5, 0
    # weights 0.3 / 0.1 / 0.4 / 0.2 (sum 1)
    a = 0.3 * 0 + 0.1 * 1 + 0.4 * 1 + 0.2 * 1  # 0.7
    b = 0.3 * 0.5 + 0.1 * 1 + 0.4 / 3 + 0.2 * 0.5  # 0.48333
    c = 0.3 * 1 + 0.1 * 1 + 0.4 * 0 + 0.2 * 0  # 0.4
    scores = hardware_scores(THREE)
    assert scores == pytest.approx({"a": floored(a), "b": floored(b), "c": floored(c)})
    assert scores["a"] == pytest.approx(0.715)


def test_weights_are_divided_by_their_sum():
    # Equal weights of 2: the plain mean of the four normalised metrics.
    scores = hardware_scores(THREE, ScoreWeights(cpu=2.0, ram=2.0, speed=2.0, latency=2.0))
    expected = {"a": (0 + 1 + 1 + 1) / 4, "b": (0.5 + 1 + 1 / 3 + 0.5) / 4, "c": (1 + 1 + 0 + 0) / 4}
    assert scores == pytest.approx({d: floored(s) for d, s in expected.items()})


def test_unmeasured_metric_counts_as_the_pool_median():
    pool = {
        "a": profile(gflops=1.0),
        "b": profile(gflops=2.0),
        "c": profile(gflops=4.0),
        "d": profile(gflops=None),
    }
    # a, b, c normalise to 0, 1/3, 1; d gets their median 1/3.
    scores = hardware_scores(pool, ONLY_CPU)
    assert scores == pytest.approx(
        {"a": floored(0.0), "b": floored(1 / 3), "c": floored(1.0), "d": floored(1 / 3)}
    )


def test_metric_unmeasured_or_equal_everywhere_gives_everyone_full_marks():
    pool = {"a": profile(), "b": profile(), "c": profile()}
    assert hardware_scores(pool) == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0})
    assert hardware_scores({"solo": THREE["c"]}) == pytest.approx({"solo": 1.0})


def test_scores_are_relative_to_the_pool_given():
    # Without c, b is the weakest CPU of the pool and scores 0 on it.
    scores = hardware_scores({"a": THREE["a"], "b": THREE["b"]}, ONLY_CPU)
    assert scores == pytest.approx({"a": floored(0.0), "b": floored(1.0)})


def test_no_score_is_zero_and_penalties_multiply():
    scores = hardware_scores(THREE, ONLY_CPU, penalties={"a": 0.5, "c": 0.25, "gone": 0.1})
    assert scores == pytest.approx({"a": 0.05 * 0.5, "b": floored(0.5), "c": 1.0 * 0.25})
    assert min(hardware_scores(THREE, ONLY_CPU).values()) == pytest.approx(0.05)


def test_bad_score_weights_are_refused():
    with pytest.raises(ValueError):
        ScoreWeights(cpu=0.0, ram=0.0, speed=0.0, latency=0.0)
    with pytest.raises(ValueError):
        ScoreWeights(cpu=-1.0)


def test_select_all_and_random():
    assert select_all(["c", "a", "b"]) == ["a", "b", "c"]
    devices = [f"d{i}" for i in range(10)]
    picked = select_random(devices, 3, np.random.default_rng(0))
    assert len(picked) == 3 and set(picked) <= set(devices)
    assert picked == select_random(devices, 3, np.random.default_rng(0))
    assert select_random(devices[:2], 5, np.random.default_rng(0)) == ["d0", "d1"]


def test_top_k_without_exploration_takes_the_best_ties_by_id():
    scores = {"b": 0.5, "a": 0.5, "c": 0.9, "d": 0.1}
    rng = np.random.default_rng(0)
    assert select_top_k(scores, 2, over_select=1.0, explore=0.0, rng=rng) == ["c", "a"]
    assert select_top_k(scores, 3, over_select=1.0, explore=0.0, rng=rng) == ["c", "a", "b"]


def test_top_k_over_selects_and_clamps():
    scores = {f"d{i}": 1.0 - i / 20 for i in range(20)}
    rng = np.random.default_rng(0)
    assert len(select_top_k(scores, 3, explore=0.0, rng=rng)) == 4  # ceil(1.3 * 3)
    assert len(select_top_k(scores, 10, explore=0.0, rng=rng)) == 13  # not 14 from 13.000000000000002
    assert select_top_k(scores, 3, explore=0.0, rng=rng) == ["d0", "d1", "d2", "d3"]
    few = {"x": 0.2, "y": 0.9}
    assert select_top_k(few, 5, rng=rng) in (["y", "x"], ["x", "y"])
    assert select_top_k(few, 0, rng=rng) == []


def test_exploration_sometimes_picks_the_weakest_device():
    scores = {f"d{i}": 1.0 - i / 10 for i in range(10)}  # d9 is the weakest
    rng = np.random.default_rng(1)
    rounds = [select_top_k(scores, 1, over_select=1.0, explore=0.1, rng=rng) for _ in range(1000)]
    # Each round d9 is picked with probability 0.1 * 1/10; never in 1000 rounds has chance 4e-5.
    assert sum(r == ["d9"] for r in rounds) > 0
    assert sum(r == ["d0"] for r in rounds) > 850  # exploit with 0.9, plus 0.1 * 1/10 by exploring
    rng = np.random.default_rng(1)
    assert all(select_top_k(scores, 1, over_select=1.0, explore=0.0, rng=rng) == ["d0"] for _ in range(1000))


def test_top_k_is_deterministic_given_the_rng():
    scores = {f"d{i}": 1.0 - i / 10 for i in range(10)}
    runs = [select_top_k(scores, 4, explore=0.5, rng=np.random.default_rng(7)) for _ in range(2)]
    assert runs[0] == runs[1] and len(set(runs[0])) == 6


def test_update_penalties():
    before = {"a": 1.0, "b": 0.5, "c": 0.25, "e": 0.95}
    after = update_penalties(before, selected=["a", "b", "d", "e"], on_time=["b", "e", "c"])
    # a, d missed: x0.5 (d starts from 1); b, e delivered: +0.1 capped at 1; c was not selected.
    assert after == pytest.approx({"a": 0.5, "b": 0.6, "c": 0.25, "d": 0.5, "e": 1.0})
    assert before == {"a": 1.0, "b": 0.5, "c": 0.25, "e": 0.95}
    low = {"x": 0.015}
    assert update_penalties(low, ["x"], [])["x"] == pytest.approx(0.01)  # floored, never 0
    assert update_penalties({}, ["x"], [], factor=0.25)["x"] == pytest.approx(0.25)


def test_learning_rate_falls_along_a_cosine_to_its_final_fraction():
    rates = [learning_rate_for_round(r, 5, 1e-2, 0.1) for r in range(1, 7)]
    np.testing.assert_allclose(rates, [1e-2, 8.68198e-3, 5.5e-3, 2.31802e-3, 1e-3, 1e-3], rtol=1e-5)
    assert [learning_rate_for_round(r, 3, 2e-3, 1.0) for r in (1, 2, 3)] == [2e-3] * 3
    assert learning_rate_for_round(1, 1, 2e-3, 0.5) == 2e-3  # one round: no schedule to follow
    with pytest.raises(ValueError):
        learning_rate_for_round(1, 5, 1e-2, 0.0)


def test_adaptive_epochs_scale_with_the_score():
    assert adaptive_epochs({"a": 1.0, "b": 0.7, "c": 0.1}, 10) == {"a": 10, "b": 7, "c": 1}
    assert adaptive_epochs({"a": 0.8, "b": 0.6, "c": 0.1}, 4) == {"a": 4, "b": 3, "c": 1}  # 3.0, 0.5->1
    # Halves round up: 5 * 0.5 = 2.5 -> 3 (Python's round would give 2).
    assert adaptive_epochs({"a": 1.0, "b": 0.5}, 5) == {"a": 5, "b": 3}
    assert adaptive_epochs({}, 5) == {}
    assert fixed_epochs(["a", "b"], 3) == {"a": 3, "b": 3}
    with pytest.raises(ValueError):
        adaptive_epochs({"a": 1.0}, 0)


def test_hardware_weighted_multiplies_samples_by_score():
    a = {"w": np.array([0.0, 4.0], np.float32)}
    b = {"w": np.array([4.0, 0.0], np.float32)}
    # n = 1, 3 and S = 1, 1/3: both weigh 1, the plain mean; FedAvg would give [3, 1].
    out = hardware_weighted([a, b], [1, 3], [1.0, 1 / 3])
    np.testing.assert_allclose(out["w"], [2.0, 2.0], rtol=1e-6)
    assert out["w"].dtype == np.float32
    # n = 1, 1 and S = 0.25, 0.75: weights 1/4, 3/4.
    np.testing.assert_allclose(hardware_weighted([a, b], [1, 1], [0.25, 0.75])["w"], [3.0, 1.0])
    with pytest.raises(ValueError):
        hardware_weighted([a, b], [1, 1], [1.0])


def test_a_device_claiming_the_best_hardware_outweighs_the_median_device_three_times_at_most():
    # four devices of ordinary hardware near the score floor; one whose profile says it is far better
    updates = [{"w": np.zeros(1, np.float32)}] * 4 + [{"w": np.ones(1, np.float32)}]
    scores = [0.1, 0.12, 0.1, 0.11, 1.0]
    out = hardware_weighted(updates, [300] * 5, scores)
    assert out["w"][0] == pytest.approx(3 * 0.11 / (0.1 + 0.12 + 0.1 + 0.11 + 3 * 0.11))
    within = [0.5, 0.6, 0.7, 0.8, 1.0]  # an honest spread within the multiple is weighed as it is
    assert hardware_weighted(updates, [300] * 5, within)["w"][0] == pytest.approx(1.0 / sum(within))


def results(*arrays: dict, samples: list[int]) -> list[Result]:
    return [Result(f"d{i}", a, n) for i, (a, n) in enumerate(zip(arrays, samples, strict=True))]


def test_aggregation_hooks():
    a = {"w": np.array([0.0, 4.0], np.float32)}
    b = {"w": np.array([4.0, 0.0], np.float32)}
    both = results(a, b, samples=[1, 3])
    start = {"w": np.zeros(2, np.float32)}
    for name in ("fedavg", "fedprox", "random_k", "topk_only", "epochs_only"):
        np.testing.assert_allclose(
            make_strategy(name, 2, 1).aggregate(1, both, start)["w"], fedavg([a, b], [1, 3])["w"]
        )
    hardware = make_strategy("hardware", 2, 1)
    hardware.scores = {"d0": 1.0, "d1": 1 / 3}  # as its plan of the round left them
    np.testing.assert_allclose(hardware.aggregate(1, both, start)["w"], [2.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(make_strategy("median", 2, 1).aggregate(1, both, start)["w"], [2.0, 2.0])


def test_fednova_divides_each_change_by_its_steps():
    start = {"w": np.zeros(2, np.float32), "n": np.array(0, np.int64)}
    fast = {"w": np.array([8.0, 0.0], np.float32), "n": np.array(4, np.int64)}  # 8 steps of 1
    slow = {"w": np.array([0.0, 2.0], np.float32), "n": np.array(2, np.int64)}  # 2 steps of 1
    out = fednova(start, [fast, slow], [1, 1], [8, 2])
    # each change per step: (1, 0) and (0, 1); averaged (0.5, 0.5); times the mean steps, 5
    np.testing.assert_allclose(out["w"], [2.5, 2.5])
    np.testing.assert_allclose(fedavg([fast, slow], [1, 1])["w"], [4.0, 1.0])  # leans to the fast one
    assert out["w"].dtype == np.float32 and out["n"] == 3
    same = fednova(start, [fast, slow], [1, 3], [4, 4])  # equal steps: FedAvg itself
    np.testing.assert_allclose(same["w"], fedavg([fast, slow], [1, 3])["w"])
    with pytest.raises(ValueError):
        fednova(start, [fast, slow], [1, 1], [8, 0])


def test_time_budget_is_the_fastest_devices_time_for_the_epochs_and_fednova_averages():
    pool = {"pi5": profile(seconds=0.005), "pi3": profile(seconds=0.02)}
    strategy = make_strategy("time_budget", 2, 3)
    first = strategy.configure_round(1, pool, np.random.default_rng(0))
    assert first.work["pi3"] == Work(3) and first.needed == 2, "no budget before any update"
    start = {"w": np.zeros(1, np.float32)}
    done = [
        Result("pi5", {"w": np.array([6.0], np.float32)}, 100, steps=6),
        Result("pi3", {"w": np.array([1.0], np.float32)}, 300, steps=1),
    ]
    # a change of 1 per step from each; the mean steps by samples: 0.25 x 6 + 0.75 x 1
    np.testing.assert_allclose(strategy.aggregate(1, done, start)["w"], [2.25])
    plan = strategy.configure_round(2, pool, np.random.default_rng(0))
    assert plan.work["pi3"].config == {"time_budget_s": pytest.approx(0.005 * 100 * 3)}
    assert plan.work["pi5"] == plan.work["pi3"] and plan.selected == ["pi3", "pi5"]
    unreported = [replace(r, steps=None) for r in done]
    np.testing.assert_allclose(
        strategy.aggregate(2, unreported, start)["w"], fedavg([r.arrays for r in done], [100, 300])["w"]
    )


def test_fedstaleweight_weights_a_device_up_by_its_mean_staleness_over_the_updates_that_counted():
    strategy = make_strategy("fedstaleweight", 2, 1)
    start = {"w": np.zeros(1, np.float32)}
    pi5, pi3 = {"w": np.array([0.0], np.float32)}, {"w": np.array([3.0], np.float32)}
    fresh = [Result("pi3", pi3, 10, staleness=0), Result("pi5", pi5, 10)]
    np.testing.assert_allclose(strategy.aggregate(1, fresh, start)["w"], [1.5], err_msg="no one late: FedAvg")
    strategy.on_round_end(1, RoundPlan({}, 2), set(), False, ["pi3", "pi5"])
    late = [Result("pi3", pi3, 10, staleness=2), Result("pi5", pi5, 10)]
    # pi3's mean staleness over its two updates is 1: weights 20 and 10
    np.testing.assert_allclose(strategy.aggregate(2, late, start)["w"], [2.0])
    assert strategy.aggregate(2, late[1:], start)["w"][0] == 0.0  # tried without pi3, which then counts
    strategy.on_round_end(2, RoundPlan({}, 2), set(), False, ["pi3", "pi5"])
    assert strategy.mean_staleness("pi3", 0) == pytest.approx(2 / 3)
    assert strategy.mean_staleness("pi5", 0) == 0.0
    # a round run again counts nothing
    strategy.aggregate(3, late, start)
    strategy.on_round_end(3, RoundPlan({}, 2), set(), True, [])
    assert strategy.counted == {"pi3": 2, "pi5": 2}


def test_ca2fl_caches_the_changes_that_counted_and_forgets_them_when_stale_or_when_the_model_grows():
    strategy = make_strategy("ca2fl", 2, 1)
    start = {"w": np.zeros(1, np.float32)}
    pi5, pi3 = {"w": np.array([1.0], np.float32)}, {"w": np.array([3.0], np.float32)}
    both = [Result("pi3", pi3, 10), Result("pi5", pi5, 10)]
    np.testing.assert_allclose(strategy.aggregate(1, both, start)["w"], [2.0], err_msg="no cache: FedAvg")
    strategy.on_round_end(1, RoundPlan({}, 2), set(), False, ["pi5"])  # pi3's update broke the aggregation
    assert set(strategy.cache) == {"pi5"}
    # round 2: pi5's cached 1 over both devices, plus pi3's 3 - nothing and pi5's 1 - 1, averaged: FedAvg
    np.testing.assert_allclose(strategy.aggregate(2, both, start)["w"], [2.0])
    strategy.on_round_end(2, RoundPlan({}, 2), set(), False, ["pi3", "pi5"])
    # round 3: pi3 is silent, its change of 3 still in the step: (3 + 1) / 2, plus pi5's 2 - 1
    pi5_again = [Result("pi5", {"w": np.array([2.0], np.float32)}, 10)]
    np.testing.assert_allclose(strategy.aggregate(3, pi5_again, start)["w"], [3.0])
    strategy.on_round_end(3, RoundPlan({}, 2), set(), True, [])  # a round run again caches nothing
    assert {d: c.round for d, c in strategy.cache.items()} == {"pi3": 2, "pi5": 2}
    grown = {"w": np.zeros(2, np.float32)}
    grown_pi5 = [Result("pi5", {"w": np.ones(2, np.float32)}, 10)]
    np.testing.assert_allclose(strategy.aggregate(4, grown_pi5, grown)["w"], [1, 1], err_msg="cache unused")
    strategy.on_round_end(2 + CACHE_ROUNDS, RoundPlan({}, 2), set(), False, [])
    assert strategy.cache == {}, "a device silent for CACHE_ROUNDS rounds no longer moves the model"


def test_coordinate_median_ignores_a_minority_of_outliers():
    honest = [{"w": np.array([1.0, 2.0], np.float32)}, {"w": np.array([1.2, 1.8], np.float32)}]
    poisoned = {"w": np.array([1e6, -1e6], np.float32)}
    np.testing.assert_allclose(coordinate_median([*honest, poisoned])["w"], [1.2, 1.8])
    np.testing.assert_allclose(fedavg([*honest, poisoned], [1, 1, 1])["w"][0], 333334.06, rtol=1e-6)
    assert coordinate_median(honest)["w"].dtype == np.float32
    with pytest.raises(ValueError):
        coordinate_median([])


def test_registry():
    # the seeds' methods and their baselines stay registered; a new strategy needs no edit here
    assert {"fedavg", "fedprox", "hardware", "topk_only", "epochs_only", "fedbn", "quality"} <= set(
        STRATEGIES
    )
    assert {"grouped", "class_prior", "mkd", "median", "trimmed_mean", "fedbuff"} <= set(STRATEGIES)
    assert all(make_strategy(name, 3, 2).name == name for name in STRATEGIES)
    hw = make_strategy("hardware", 3, 2)
    assert (hw.top_k, hw.adaptive, hw.weighted, hw.params.max_staleness) == (True, True, True, 5)
    assert isinstance(hw, Strategy)
    with pytest.raises(ValueError, match="unknown strategy 'best'"):
        make_strategy("best", 3, 2)


# d0 is the most capable, d4 the least: gflops 5..1, equal RAM, T 0.01..0.05 s, rtt 10..50 ms.
POOL = {f"d{i}": profile(gflops=5.0 - i, seconds=0.01 * (i + 1), rtt=10.0 * (i + 1)) for i in (3, 1, 4, 0, 2)}
# cpu 1, .75, .5, .25, 0; ram 1; speed (1/T - 20) / 80 = 1, .375, 1/6, .0625, 0; latency 1, .75, .5, .25, 0
POOL_SCORES = {
    "d0": floored(0.3 + 0.1 + 0.4 + 0.2),  # 1.0
    "d1": floored(0.3 * 0.75 + 0.1 + 0.4 * 0.375 + 0.2 * 0.75),  # 0.64375
    "d2": floored(0.3 * 0.5 + 0.1 + 0.4 / 6 + 0.2 * 0.5),  # 0.44583
    "d3": floored(0.3 * 0.25 + 0.1 + 0.4 * 0.0625 + 0.2 * 0.25),  # 0.2875
    "d4": floored(0.1),  # 0.145
}
ALL = ["d0", "d1", "d2", "d3", "d4"]


def strategy(name: str, k: int = 2, **changes) -> Strategy:
    """A strategy with its settings (Params fields) and any other attribute changed."""
    settings = {f.name for f in dataclasses.fields(strategy_class(name).Params)}
    made = make_strategy(
        name, k, 4, strategy_params(name, {key: v for key, v in changes.items() if key in settings})
    )
    for key, value in changes.items():
        if key not in settings:
            setattr(made, key, value)
    return made


def plan(name: str, k: int = 2, seed: int = 0, round: int = 1, **changes) -> RoundPlan:
    return strategy(name, k, **changes).configure_round(round, POOL, np.random.default_rng(seed))


def epochs(p: RoundPlan) -> dict[str, int]:
    return {d: w.epochs for d, w in p.work.items()}


def test_pool_scores():
    assert hardware_scores(POOL) == pytest.approx(POOL_SCORES)
    hardware = strategy("hardware")
    hardware.configure_round(1, POOL, np.random.default_rng(0))
    assert hardware.scores == pytest.approx(POOL_SCORES)


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_plan_all_fixed(name):
    p = plan(name)
    assert p.selected == ALL and epochs(p) == dict.fromkeys(ALL, 4) and p.needed == 5
    mu = {"fedavg": {}, "fedprox": {"proximal_mu": 0.01}}[name]
    assert all(w.config == mu for w in p.work.values())


def test_plan_random_k():
    p = plan("random_k")
    assert len(p.selected) == 2 and set(p.selected) <= set(ALL) and p.needed == 2
    assert epochs(p) == dict.fromkeys(p.selected, 4)
    assert plan("random_k", seed=3) == plan("random_k", seed=3)
    clamped = plan("random_k", k=9)
    assert clamped.selected == ALL and clamped.needed == 5


def test_plan_hardware():
    # Top ceil(1.3 * 2) = 3; epochs 4 * S_i / S_max = 4, 2.575 -> 3, 1.78 -> 2.
    p = plan("hardware", explore=0.0)
    assert p.selected == ["d0", "d1", "d2"] and epochs(p) == {"d0": 4, "d1": 3, "d2": 2} and p.needed == 2
    explored = plan("hardware", seed=5)  # the preset itself, exploring at 0.1
    assert len(explored.selected) == 3 and explored.needed == 2
    assert max(epochs(explored).values()) == 4  # the best device of the round trains e_max epochs
    clamped = plan("hardware", k=9)
    assert sorted(clamped.selected) == ALL and clamped.needed == 5


def test_plan_hardware_uses_penalties():
    p = plan("hardware", explore=0.0, penalties={"d0": 0.25})
    # d0 falls to 0.25, below d3's 0.2875; the best selected is now d1 with 4 epochs.
    assert p.selected == ["d1", "d2", "d3"] and p.needed == 2
    assert epochs(p) == {"d1": 4, "d2": 3, "d3": 2}  # 4 * .44583/.64375 = 2.77, 4 * .2875/.64375 = 1.79


def test_a_missed_deadline_scores_down_the_late_devices_only():
    hardware = strategy("hardware", explore=0.0)
    p = hardware.configure_round(1, POOL, np.random.default_rng(0))
    hardware.on_round_end(1, p, on_time={"d0", "d1"}, deadline_missed=True, aggregated=["d0", "d1"])
    assert hardware.penalties == {"d0": 1.0, "d1": 1.0, "d2": 0.5}
    hardware.on_round_end(2, p, on_time={"d0", "d2"}, deadline_missed=False, aggregated=["d0", "d2"])
    assert hardware.penalties == pytest.approx({"d0": 1.0, "d1": 1.0, "d2": 0.6})  # beaten, not late
    assert hardware.last_aggregated == {"d0": 2, "d1": 1, "d2": 2}


def test_plan_ablations():
    top = plan("topk_only", explore=0.0)
    assert top.selected == ["d0", "d1", "d2"] and epochs(top) == dict.fromkeys(top.selected, 4)
    assert top.needed == 2
    # epochs 4 * S_i: 4, 2.575, 1.78, 1.15, 0.58 -> 4, 3, 2, 1, 1
    p = plan("epochs_only")
    assert p.selected == ALL and epochs(p) == {"d0": 4, "d1": 3, "d2": 2, "d3": 1, "d4": 1} and p.needed == 5


def test_plan_refuses_bad_arguments():
    with pytest.raises(ValueError):
        plan("fedavg", k=0)
    with pytest.raises(ValueError):
        make_strategy("fedavg", 2, 0)
    with pytest.raises(ValueError, match="explore must be between 0 and 1"):
        make_strategy("hardware", 2, 4, strategy_params("hardware", {"explore": 1.5}))


def test_stale_devices_are_required_on_top_of_the_first_k():
    hardware = strategy("hardware", explore=0.0)
    assert hardware.params.max_staleness == 5

    def stale_plan(staleness: dict[str, int], round: int = 20) -> RoundPlan:
        hardware.last_aggregated = {d: round - staleness.get(d, 0) for d in POOL}
        return hardware.configure_round(round, POOL, np.random.default_rng(0))

    fresh = stale_plan({"d3": 4, "d4": 4})
    assert fresh.selected == ["d0", "d1", "d2"] and fresh.required == [] and fresh.needed == 2
    stale = stale_plan({"d1": 9, "d3": 5, "d4": 4})
    # d3 (5 rounds) is waited for; d1, stale too, is among the best K anyway; d4 (4 rounds) is not asked
    assert stale.selected == ["d0", "d1", "d2", "d3"] and stale.required == ["d3"] and stale.needed == 2
    assert stale.work["d3"].epochs == 1  # 4 * .2875 / 1.0 = 1.15
    hardware.params = replace(hardware.params, max_staleness=0)
    off = stale_plan({"d4": 99})
    assert off.required == [] and "d4" not in off.selected


def test_every_setting_is_bounded_and_documented():
    """Each strategy's Params field has bounds or is a yes/no, and the README's settings table gives it."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    for name in STRATEGIES:
        params = strategy_class(name).Params
        for f in dataclasses.fields(params):
            assert f.type in (bool, "bool") or {"low", "high"} <= f.metadata.keys(), (name, f.name)
            row = [r for r in rows if f"`{name}`" in r.split("|")[1] and f"`{f.name}=" in r]
            assert row, f"README: no settings row gives {name}'s {f.name}"
            default = str(f.default).lower() if isinstance(f.default, bool) else f"{f.default:g}"
            assert f"`{f.name}={default}`" in row[0], (name, f.name, default)
