"""DP-FedAvg's step: clipped, equally weighted, noised with the right spread, fixed denominator."""

import math

import numpy as np
import pytest

from fedspeech.coordinator.aggregate import dp_mean

CURRENT = {"w": np.zeros(4000, np.float32), "running_mean": np.ones(3, np.float32)}


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
