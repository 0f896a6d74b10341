"""Bulyan: Krum's picks and the weight-by-weight trim around their median, pure maths without any network."""

import numpy as np
import pytest

from fedspeech.coordinator.strategies import Result, make_strategy, strategy_params
from fedspeech.coordinator.strategies.bulyan import bulyan, bulyan_picks
from fedspeech.coordinator.strategies.catalogue import listing

RNG = np.random.default_rng(0)
HONEST = [
    {"w": RNG.normal(1.0, 0.1, (4, 3)).astype(np.float32), "b": RNG.normal(0, 0.1, 3)} for _ in range(6)
]


def test_a_far_update_is_never_picked_and_every_weight_stays_among_the_honest_ones():
    poisoned = {"w": -3 * HONEST[0]["w"], "b": -3 * HONEST[0]["b"]}
    updates = [*HONEST, poisoned]  # n = 7 = 4f + 3 for f = 1
    assert bulyan_picks(updates, 1) == sorted(bulyan_picks(updates, 1)) and 6 not in bulyan_picks(updates, 1)
    assert len(bulyan_picks(updates, 1)) == 5  # n - 2f
    aggregated = bulyan(updates, 1)
    for name in ("w", "b"):
        honest = np.stack([u[name] for u in HONEST])
        assert np.all(aggregated[name] >= honest.min(axis=0) - 1e-6)
        assert np.all(aggregated[name] <= honest.max(axis=0) + 1e-6)
    assert aggregated["w"].dtype == np.float32


def test_one_weight_pushed_by_an_update_that_krum_picks_is_trimmed_away():
    # the attacker sends the crowd's mean but for one weight: close in norm, so Krum picks it; however far
    # it pushes that weight (within Krum's pick), Bulyan's value there does not move
    values = []
    for push in (0.25, 0.3, 0.4):
        sneaky = {
            name: np.mean([u[name] for u in HONEST], axis=0).astype(HONEST[0][name].dtype)
            for name in HONEST[0]
        }
        sneaky["w"][0, 0] += push
        updates = [*HONEST, sneaky]
        assert 6 in bulyan_picks(updates, 1)
        values.append(float(bulyan(updates, 1)["w"][0, 0]))
    honest = [float(u["w"][0, 0]) for u in HONEST]
    assert values[0] == values[1] == values[2] and min(honest) <= values[0] <= max(honest)


def test_with_no_byzantine_device_it_is_the_plain_average():
    aggregated = bulyan(HONEST[:3], 0)
    assert np.allclose(aggregated["w"], np.mean([u["w"] for u in HONEST[:3]], axis=0), atol=1e-6)


def test_too_few_updates_are_refused_and_the_strategy_asks_for_enough_devices():
    with pytest.raises(ValueError, match="at least 7 updates"):
        bulyan(HONEST, 1)
    assert make_strategy("bulyan", 10, 1, strategy_params("bulyan", {"f": "2"})).needs.min_devices == 11
    updates = [*HONEST, {"w": 50 * HONEST[2]["w"], "b": HONEST[2]["b"]}]
    results = [Result(f"d{i}", u, 10**9 if i == 6 else 10) for i, u in enumerate(updates)]  # claims count not
    aggregated = make_strategy("bulyan", 10, 1, strategy_params("bulyan", {"f": "1"})).aggregate(
        1, results, HONEST[0]
    )
    assert all(np.array_equal(aggregated[name], bulyan(updates, 1)[name]) for name in ("w", "b"))
    assert "bulyan: " in listing() and "    f=1 (0 to 1000)" in listing().split("bulyan: ")[1]
