"""Krum and Multi-Krum: the scores, the choice and the strategy, pure maths without any network."""

import itertools

import numpy as np
import pytest

from fedspeech.coordinator.strategies import Result, make_strategy, strategy_params
from fedspeech.coordinator.strategies.krum import krum_scores, multi_krum

RNG = np.random.default_rng(0)
HONEST = [
    {"w": RNG.normal(1.0, 0.1, (4, 3)).astype(np.float32), "b": RNG.normal(0, 0.1, 3)} for _ in range(5)
]
POISONED = {"w": -3 * HONEST[0]["w"], "b": -3 * HONEST[0]["b"]}  # a sign-flipped, boosted update


def test_scores_are_the_summed_squared_distances_to_the_nearest_others():
    updates = [*HONEST, POISONED]
    f = 1
    flat = [np.concatenate([u["w"].ravel(), u["b"].ravel()]).astype(np.float64) for u in updates]
    for i, score in enumerate(krum_scores(updates, f)):
        others = sorted(float(np.sum((flat[i] - flat[j]) ** 2)) for j in range(len(updates)) if j != i)
        assert score == pytest.approx(sum(others[: len(updates) - f - 2]))


def test_krum_takes_an_honest_update_and_multi_krum_averages_all_honest_ones():
    updates = [*HONEST, POISONED]
    krum, chosen = multi_krum(updates, f=1, m=1)
    assert chosen != [5] and len(chosen) == 1
    assert np.array_equal(krum["w"], HONEST[chosen[0]]["w"])
    averaged, chosen = multi_krum(updates, f=1, m=0)  # n - f = 5: every honest update, not the poisoned
    assert chosen == [0, 1, 2, 3, 4]
    assert np.allclose(averaged["w"], np.mean([u["w"] for u in HONEST], axis=0), atol=1e-6)
    assert averaged["w"].dtype == np.float32


def test_the_order_of_the_updates_does_not_change_the_choice():
    updates = [*HONEST, POISONED]
    expected = multi_krum(updates, f=1, m=3)[0]
    for order in itertools.islice(itertools.permutations(range(6)), 0, 720, 97):
        result = multi_krum([updates[i] for i in order], f=1, m=3)[0]
        assert np.allclose(result["w"], expected["w"], atol=1e-6)


def test_too_few_updates_for_f_are_refused():
    with pytest.raises(ValueError, match="more than 4 updates, got 4"):
        krum_scores(HONEST[:4], f=1)
    assert len(krum_scores(HONEST[:3], f=0)) == 3


def test_the_strategy_is_set_from_text_and_ignores_claimed_samples():
    krum = make_strategy("krum", 3, 1, strategy_params("krum", {"f": "1", "m": "0"}))
    assert krum.needs.min_devices == 5
    results = [Result(f"d{i}", u, 10) for i, u in enumerate(HONEST)]
    results.append(Result("liar", POISONED, 100_000))
    new = krum.aggregate(1, results, HONEST[0])
    assert np.allclose(new["w"], np.mean([u["w"] for u in HONEST], axis=0), atol=1e-6)
    assert make_strategy("krum", 3, 1, strategy_params("krum", {"f": 2})).needs.min_devices == 7


@pytest.mark.parametrize("options", [{"f": "-1"}, {"f": "1.5"}, {"m": "-2"}, {"g": "1"}])
def test_bad_settings_are_refused(options):
    with pytest.raises(ValueError, match="strategy krum"):
        strategy_params("krum", options)
