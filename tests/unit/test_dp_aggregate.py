"""DP-FedAvg's step: clipped, equally weighted, noised with the right spread, fixed denominator."""

import math

import numpy as np
import pytest

from fedspeech.coordinator.strategies import Result, make_strategy
from fedspeech.coordinator.strategies.differential_privacy import (
    DifferentiallyPrivate,
    PrivacySettings,
    adapted_clip,
    change_noise_multiplier,
    count_noise,
    dp_mean,
)

CURRENT = {"w": np.zeros(4000, np.float32), "running_mean": np.ones(3, np.float32)}
UNIT = np.full(4000, 1 / math.sqrt(4000), np.float32)  # a change of norm 1


def update(change: float, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": (rng.normal(0, change, 4000)).astype(np.float32),
        "running_mean": np.full(3, 2.0, np.float32),
    }


def norm(arrays: dict[str, np.ndarray]) -> float:
    return math.sqrt(float(np.sum(arrays["w"].astype(np.float64) ** 2)))


def test_without_noise_it_is_the_clipped_changes_over_the_expected_count():
    small, large = update(0.001, 0), update(1.0, 1)  # norms about 0.06 and 63
    step = dp_mean(
        CURRENT, [small, large], clip=1.0, noise_multiplier=0.0, expected=4, rng=np.random.default_rng(0)
    )
    clipped_large = large["w"] / norm(large)
    assert np.allclose(step["w"], (small["w"] + clipped_large) / 4, atol=1e-6)
    assert np.allclose(step["running_mean"], 2.0)  # not stepped: averaged


def test_one_device_moves_the_step_by_at_most_clip_over_expected():
    others = [update(0.5, seed) for seed in range(5)]
    rng = np.random.default_rng
    with_it = dp_mean(CURRENT, [*others, update(50.0, 9)], 1.0, 0.0, 6, rng(0))
    without = dp_mean(CURRENT, others, 1.0, 0.0, 6, rng(0))
    moved = norm({"w": with_it["w"].astype(np.float64) - without["w"]})
    assert moved == pytest.approx(1.0 / 6, rel=1e-4)


def test_the_noise_has_the_standard_deviation_asked_for():
    steps = [dp_mean(CURRENT, [CURRENT], 0.5, 2.0, 1, np.random.default_rng(seed))["w"] for seed in range(5)]
    spread = np.std(np.concatenate(steps))
    assert spread == pytest.approx(2.0 * 0.5, rel=0.02)  # 20,000 draws: 2 % is many standard errors


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="expected count"):
        dp_mean(CURRENT, [CURRENT], 1.0, 1.0, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="need updates"):
        dp_mean(CURRENT, [], 1.0, 1.0, 3, np.random.default_rng(0))


def test_adaptive_clippings_two_noises_are_one_gaussian_mechanism_of_the_noise_multiplier():
    for z, expected in [(0.5, 6), (1.0, 100), (1.3, 1000), (0.05, 20)]:
        deviation = count_noise(expected, z)
        assert deviation >= z and deviation >= expected / 20
        changes = change_noise_multiplier(z, deviation)
        assert z < changes <= z / math.sqrt(0.75) + 1e-12, "the changes pay for the count, a little"
        # one device moves (change, its count's +-1/2 scaled to the change's noise) by this much at most:
        scale = changes / deviation  # the count, in units of the clip, as noisy as the changes
        reach = math.hypot(1.0, scale / 2)
        assert changes / reach == pytest.approx(z), "the noise over the reach: the accountant's z"
    with pytest.raises(ValueError):
        change_noise_multiplier(1.0, 0.5)  # a count noised below z / 2 cannot be paid for


def test_the_clip_steps_geometrically_towards_the_target_quantile():
    assert adapted_clip(2.0, within=0.0, expected=10, target=0.5, learning_rate=0.2) == pytest.approx(2.0)
    shrunk = adapted_clip(2.0, within=5.0, expected=10, target=0.5, learning_rate=0.2)  # all 10 within
    assert shrunk == pytest.approx(2.0 * math.exp(-0.2 * 0.5))
    grown = adapted_clip(2.0, within=-5.0, expected=10, target=0.9, learning_rate=0.2)  # none within
    assert grown == pytest.approx(2.0 * math.exp(0.2 * 0.9))


def test_adapting_dp_fedavg_finds_the_median_norm_of_the_changes_in_a_few_dozen_rounds():
    privacy = PrivacySettings(
        noise_multiplier=0.1, norm_bound=0.1, norm_bound_quantile=0.5, norm_bound_learning_rate=0.2
    )
    strategy = make_strategy("fedavg", 1, 1, privacy=privacy)
    assert isinstance(strategy, DifferentiallyPrivate)
    pool = {f"d{n:02}": None for n in range(40)}
    current = {"w": np.zeros(4000, np.float32)}
    norms = {d: 1.0 + n / 4 for n, d in enumerate(pool)}  # 1 to 10.75: the median is 5.875
    clips = []
    for round in range(1, 81):
        plan = strategy.configure_round(round, pool, np.random.default_rng(round))  # type: ignore[arg-type]
        clips.append(strategy.clip)
        results = [Result(d, {"w": UNIT * norms[d]}, 10) for d in plan.work]
        strategy.aggregate(round, results, current)
    assert clips[0] == 0.1
    assert 4.5 < np.mean(clips[-20:]) < 7.5, f"the last clips {clips[-20:]}"
