"""Robust aggregation (median, trimmed mean, norm clipping) against emulated poisoning: pure maths."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from fedspeech.coordinator.strategies import STRATEGIES, Result, make_strategy
from fedspeech.coordinator.strategies.aggregate import (
    clip_updates,
    median_norm,
    trimmed_mean,
    update_norms,
)
from fedspeech.coordinator.strategies.trimmed_mean import FedTrimmedMean
from fedspeech.edge_client.trainer import Trainer
from fedspeech.protocol import weights
from fedspeech.protocol.messages import Profile
from fedspeech.protocol.weights import Arrays
from fedspeech_bench.fleets.poisoning import AttackingTrainer, attacking_trainer, tamper

RNG = np.random.default_rng(0)
START = {
    "w": RNG.normal(size=(3, 4)).astype(np.float32),
    "b": RNG.normal(size=2).astype(np.float32),
}
# The honest step: each coordinate moves by 0.05..0.15 either way, and every honest device adds noise
# of at most 0.02, so its change keeps the step's sign and stays far below a x100 one.
STEP = {
    name: RNG.uniform(0.05, 0.15, a.shape) * RNG.choice([-1.0, 1.0], a.shape) for name, a in START.items()
}


def trained(rng: np.random.Generator) -> Arrays:
    return {
        name: (a + STEP[name] + rng.uniform(-0.02, 0.02, a.shape)).astype(np.float32)
        for name, a in START.items()
    }


HONEST = [trained(RNG) for _ in range(6)]
HONEST_MEAN = {name: np.mean([h[name].astype(np.float64) for h in HONEST], axis=0) for name in START}
POISONED = [tamper(START, trained(RNG), "scale"), tamper(START, trained(RNG), "sign_flip")]
ROUND = [Result(f"d{i}", a, 100) for i, a in enumerate([*HONEST, *POISONED])]


def distance(a: Arrays, b: Arrays) -> float:
    """The L2 distance between two models, all arrays as one vector."""
    return math.sqrt(sum(float(np.sum((a[n].astype(np.float64) - b[n]) ** 2)) for n in a))


HONEST_STEP = distance(HONEST_MEAN, START)


@pytest.mark.parametrize(
    ("name", "tolerance"),
    [
        # the attackers are the extremes of every coordinate: trimming 1 each end leaves the honest six
        ("trimmed_mean", 1e-5),
        # the mean of the honest six's 3rd and 4th values, within their noise of their mean
        ("median", 0.15),
        # the sign flip, at an honest norm, passes the bound: 6/8 of the step is left, 0.25 is lost
        ("norm_bounded", 0.3),
        # the bound turns the x100 update into an honest-sized step, and the sign flip is trimmed
        ("norm_bounded_trimmed_mean", 0.1),
    ],
)
def test_robust_strategies_stay_near_the_honest_mean(name, tolerance):
    out = make_strategy(name, 8, 1).aggregate(1, ROUND, START)
    assert distance(out, HONEST_MEAN) < tolerance * HONEST_STEP


def test_fedavg_is_dragged_away_by_the_scaled_update():
    # (6 + 100 - 1) / 8 = 13.1 steps instead of 1
    out = make_strategy("fedavg", 8, 1).aggregate(1, ROUND, START)
    assert distance(out, HONEST_MEAN) > 10 * HONEST_STEP


def test_only_norm_bounded_lets_sample_counts_weigh_in():
    boasting = [
        Result(r.device_id, r.arrays, 10_000 if i >= 6 else r.num_samples) for i, r in enumerate(ROUND)
    ]
    for name in ("median", "trimmed_mean"):
        strategy = make_strategy(name, 8, 1)
        before, after = strategy.aggregate(1, ROUND, START), strategy.aggregate(1, boasting, START)
        assert all(np.array_equal(before[n], after[n]) for n in START)
    bounded = make_strategy("norm_bounded", 8, 1)
    assert distance(bounded.aggregate(1, boasting, START), bounded.aggregate(1, ROUND, START)) > 0.1


def test_clipping_scales_down_never_up():
    current = {"w": np.zeros(4, np.float32), "b": np.ones(1, np.float32)}
    # changes of norm 1, 2 and 30 (w and b together: 3-4-5 triangles, scaled)
    changes = [(0.6, 0.8), (1.2, 1.6), (18.0, 24.0)]
    updates = [
        {"w": np.array([w, 0, 0, 0], np.float32), "b": np.array([1 + b], np.float32)} for w, b in changes
    ]
    assert update_norms(current, updates) == pytest.approx([1.0, 2.0, 30.0])
    assert median_norm(current, updates) == pytest.approx(2.0)
    clipped = clip_updates(current, updates, 2.0)
    assert update_norms(current, clipped) == pytest.approx([1.0, 2.0, 2.0], rel=1e-6)
    assert clipped[0] is updates[0] and clipped[1] is updates[1]  # at or under the bound: untouched
    np.testing.assert_allclose(clipped[2]["w"], [1.2, 0, 0, 0], rtol=1e-6)  # same direction, norm 2
    np.testing.assert_allclose(clipped[2]["b"], [2.6], rtol=1e-6)
    assert all(u is c for u, c in zip(updates, clip_updates(current, updates, 1e9), strict=True))
    zero = clip_updates(current, updates, 0.0)
    assert all(np.array_equal(z[n], current[n]) for z in zero for n in current)


def test_trimmed_mean_with_trim_zero_is_the_mean():
    ups = [{"w": RNG.normal(size=(3, 4)).astype(np.float32)} for _ in range(5)]
    np.testing.assert_allclose(trimmed_mean(ups, 0.0)["w"], np.mean([u["w"] for u in ups], 0), rtol=1e-6)


def test_trimmed_mean_cuts_floor_of_trim_times_n_at_each_end():
    six = [{"w": np.array([v], np.float32)} for v in (0, 1, 2, 3, 4, 100)]
    assert trimmed_mean(six, 0.2)["w"][0] == pytest.approx(2.5)  # 1.2 -> 1: the mean of 1, 2, 3, 4
    assert trimmed_mean(six, 0.16)["w"][0] == pytest.approx(110 / 6)  # 0.96 -> 0: nothing cut
    squares = [{"w": np.array([float(i * i)])} for i in range(100)]
    # 0.29 * 100 is 28.999999999999996 in floating point, and still cuts 29 at each end
    assert trimmed_mean(squares, 0.29)["w"][0] == pytest.approx(np.mean([i * i for i in range(29, 71)]))


@pytest.mark.parametrize("trim", [-0.1, 0.5, 0.9, float("nan")])
def test_bad_trim_is_refused(trim):
    with pytest.raises(ValueError):
        trimmed_mean(HONEST, trim)
    with pytest.raises(ValueError):
        FedTrimmedMean.Params(trim=trim)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        trimmed_mean([], 0.2)
    with pytest.raises(ValueError):
        median_norm(START, [])
    for bound in (-1.0, float("nan")):
        with pytest.raises(ValueError):
            clip_updates(START, HONEST, bound)
    with pytest.raises(ValueError):
        tamper(START, HONEST[0], "backdoor")
    with pytest.raises(ValueError):
        attacking_trainer("backdoor")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtype_is_kept(dtype):
    current = {"w": np.zeros(3, dtype)}
    ups = [{"w": np.array([v, -v, 2 * v], dtype)} for v in (1.0, 2.0, 50.0)]
    assert trimmed_mean(ups, 0.2)["w"].dtype == dtype
    assert all(c["w"].dtype == dtype for c in clip_updates(current, ups, 1.0))
    assert tamper(current, ups[0], "scale")["w"].dtype == dtype
    results = [Result(f"d{i}", u, 1) for i, u in enumerate(ups)]
    for name in ("median", "trimmed_mean", "norm_bounded"):
        assert make_strategy(name, 3, 1).aggregate(1, results, current)["w"].dtype == dtype


def profile(gflops: float) -> Profile:
    return Profile(cpu_count=4, cpu_freq_mhz=1500.0, ram_available_mb=1000.0, cpu_gflops=gflops)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_strategy_aggregates_from_the_current_model(name):
    strategy = make_strategy(name, 3, 1)
    pool = {f"d{i}": profile(1.0 + i) for i in range(max(5, strategy.needs.min_devices))}
    plan = strategy.configure_round(1, pool, np.random.default_rng(0))
    # all devices sent the same update: any aggregation rule must give it back
    same = trained(np.random.default_rng(1))
    out = strategy.aggregate(1, [Result(d, same, 10 + i) for i, d in enumerate(plan.selected)], START)
    assert out.keys() == same.keys()
    for n in same:
        assert out[n].dtype == same[n].dtype
        np.testing.assert_allclose(out[n], same[n], rtol=1e-6)


def test_tamper_scales_or_flips_the_change_or_sends_minus_three_times_the_global_model():
    start = {"w": np.array([1.0, 2.0], np.float32)}
    honest = {"w": np.array([1.5, 1.0], np.float32)}
    np.testing.assert_allclose(tamper(start, honest, "scale")["w"], [51.0, -98.0])
    np.testing.assert_allclose(tamper(start, honest, "sign_flip")["w"], [0.5, 3.0])
    np.testing.assert_allclose(tamper(start, honest, "scaled_global")["w"], [-3.0, -6.0])
    assert honest["w"].tolist() == [1.5, 1.0]  # the honest weights are not changed in place


def test_attacking_trainer_uploads_the_tampered_weights_with_the_honest_metadata(monkeypatch):
    start = {"w": np.array([1.0, 2.0], np.float32)}
    honest = {"w": np.array([1.5, 1.0], np.float32)}
    metadata = {"device_id": "d9", "num_samples": "40"}

    def honest_train(self, task, arrays, train, teacher=None):
        assert arrays is start
        return "result", weights.encode(honest, metadata=metadata)

    monkeypatch.setattr(Trainer, "train", honest_train)
    trainer = attacking_trainer("sign_flip")("d9", 2)
    assert isinstance(trainer, AttackingTrainer)
    assert (trainer.device_id, trainer.torch_threads, trainer.attack) == ("d9", 2, "sign_flip")
    task = SimpleNamespace(round=1)
    result, upload = trainer.train(task, start, None)  # type: ignore[arg-type]
    arrays, sent = weights.decode(upload)
    assert result == "result" and sent == metadata
    np.testing.assert_allclose(arrays["w"], [0.5, 3.0])
    claiming = attacking_trainer("scaled_global")("d9", 1)
    arrays, sent = weights.decode(claiming.train(task, start, None)[1])  # type: ignore[arg-type]
    assert sent == {"device_id": "d9", "num_samples": "100000"}
    np.testing.assert_allclose(arrays["w"], [-3.0, -6.0])
    later = attacking_trainer("scaled_global", from_round=2)("d9", 1)  # honest in round 1
    arrays, sent = weights.decode(later.train(task, start, None)[1])  # type: ignore[arg-type]
    assert sent == metadata
    np.testing.assert_allclose(arrays["w"], honest["w"])
