"""Bounded influence: the samples an update counts for, its change's norm and direction, a device's
evaluation counts."""

import logging
import math
from dataclasses import replace

import numpy as np
import pytest

from fedspeech.coordinator.config import RoundConfig, norm_bound_value
from fedspeech.coordinator.round.evaluation import check_counts
from fedspeech.coordinator.round.influence import (
    MIN_AWAY,
    SampleLimits,
    Standings,
    checked_directions,
    cosines_with_the_others,
    direction_unchecked,
    fleet_median,
    norm_bounded,
    norm_limit,
    sample_ceiling,
    too_few_to_tell,
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
    check_counts(confusion, LABELS, {"0": 5, "1": 6}, 40)
    with pytest.raises(ValueError, match=r"more test clips than the device registered \(1: 5 of 4\)"):
        check_counts(confusion, LABELS, {"0": 5, "1": 4}, 40)
    faked = np.diag([10**9, 10**9, 0])
    with pytest.raises(ValueError, match="0: 1000000000 of 5, 1: 1000000000 of 6"):
        check_counts(faked, LABELS, {"0": 5, "1": 6}, 40)
    with pytest.raises(ValueError, match="_none_: 1 of 0"):
        check_counts(np.array([[0, 0, 0], [0, 0, 0], [0, 0, 1]]), LABELS, {"0": 5, "1": 6}, 40)


def test_test_clips_are_bounded_by_the_training_clips_a_device_counts_for_not_by_its_registration():
    registered = {"0": 10**9, "1": 10**9}  # a registration may claim any counts within the protocol's
    check_counts(np.diag([10, 10, 0]), LABELS, registered, 1)  # at least 20 test clips are plausible
    with pytest.raises(ValueError, match="21 test clips, more than the 20 its 1 training clips"):
        check_counts(np.diag([11, 10, 0]), LABELS, registered, 1)
    check_counts(np.diag([2500, 2500, 0]), LABELS, registered, 500)
    with pytest.raises(ValueError, match="5001 test clips, more than the 5000"):
        check_counts(np.diag([2501, 2500, 0]), LABELS, registered, 500)


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


def speakers_like(devices: int, reversed_: int, size: int = 20_000, seed: int = 0) -> list[Result]:
    """Changes as devices that train from one model make them: a common step under four times as much of
    each device's own (FSDD's speakers: cosine 0.02 to 0.06 between two of them; a reversed one's with
    the others' -0.096 in the first round), the last `reversed_` of them sent reversed; weights of ones
    plus the change.
    """
    rng = np.random.default_rng(seed)
    common = rng.normal(0, 1, size)
    results = []
    for i in range(devices):
        change = common + 4 * rng.normal(0, 1, size)
        if i >= devices - reversed_:
            change = -change
        results.append(Result(f"d{i}", {"w": (1 + change).astype(np.float32)}, 100))
    return results


START = {"w": np.ones(20_000, np.float32)}


def test_each_change_is_compared_with_the_others_directions_one_vote_each():
    changes = [np.array([10.0, 0.0]), np.array([0.0, 1.0]), np.array([1.0, 1.0])]
    # the long first change counts as one direction: the others of the second are (1, 0) + (1, 1) / sqrt 2
    assert cosines_with_the_others(changes) == pytest.approx([math.sin(math.pi / 8)] * 2 + [1.0])
    assert cosines_with_the_others([np.zeros(2), np.ones(2), np.ones(2)]) == [0.0, 1.0, 1.0]


@pytest.mark.parametrize(("devices", "reversed_"), [(5, 1), (6, 2), (7, 3)])
def test_reversed_changes_of_ordinary_norm_are_left_out_and_every_honest_one_kept(devices, reversed_):
    results = speakers_like(devices, reversed_)
    honest = cosines_with_the_others([r.arrays["w"] - 1.0 for r in results[: devices - reversed_]])
    assert max(honest) < 0.11, "as little in common as FSDD's speakers (0.065 to 0.077 in round 1)"
    # with 3 reversed of 7, an honest change points away from the others' at first (3 honest, 3 reversed)
    assert min(cosines_with_the_others([r.arrays["w"] - 1.0 for r in results])) < 0
    kept, directions = checked_directions(START, results)
    assert kept == results[: devices - reversed_], "each honest one kept as it was"
    assert [d.device_id for d in directions] == [f"d{i}" for i in range(devices - reversed_, devices)]
    assert all(d.cosine < 0 and d.samples == 0 for d in directions)


def test_at_most_a_strict_minority_is_left_out():
    changes = [(3, -3), (-1, -2), (-1, 3), (-3, -2), (-1, 2)]
    results = [Result(f"d{i}", {"w": np.array(c, np.float32) + 1}, 10) for i, c in enumerate(changes)]
    kept, directions = checked_directions({"w": np.ones(2, np.float32)}, results)
    # d0 and d1 left out, two of five; d3 still points away from d2 and d4, and is kept: no more is told
    assert [(d.device_id, d.samples) for d in directions] == [("d0", 0), ("d1", 0)]
    assert [(r.device_id, r.num_samples) for r in kept] == [("d2", 10), ("d3", 10), ("d4", 10)]
    half = speakers_like(6, 3)  # half reversed: no change points the others' way, nothing can be told
    assert checked_directions(START, half) == (half, [])


def test_a_change_nearly_at_right_angles_to_the_others_counts_for_no_more_than_the_median_device():
    results = speakers_like(5, 0)
    common = np.random.default_rng(0).normal(0, 1, 20_000)  # speakers_like's common step
    own = np.random.default_rng(1).normal(0, 5, 20_000)
    aside = (1 + own + 0.2 * common).astype(np.float32)
    results.append(Result("aside", {"w": aside}, 300))
    kept, directions = checked_directions(START, results)
    assert kept[:5] == results[:5]
    (told,) = directions
    assert told.device_id == "aside" and 0 < told.cosine < 0.5 * min(
        cosines_with_the_others([r.arrays["w"] - 1.0 for r in results[:5]])
    )
    assert kept[5].num_samples == told.samples == 100, "the median device's count, not its claim of 300"
    modest = [*results[:5], Result("aside", {"w": aside}, 60)]
    assert checked_directions(START, modest) == (modest, []), "a count under the median is left as it is"


def test_a_change_a_little_away_is_kept_unless_its_devices_standing_points_well_away():
    standings = Standings()
    common = np.random.default_rng(3).normal(0, 1, 20_000)  # speakers_like(seed=3)'s common step

    def a_little_away(device: str, seed: int) -> Result:
        """A change with a little less than none of the common step, as honest ones once the model learned."""
        own = np.random.default_rng(seed).normal(0, 4, 20_000)
        return Result(device, {"w": (1 + own - 0.3 * common).astype(np.float32)}, 100)

    for round in range(3):  # five devices whose changes point the same way
        assert checked_directions(START, speakers_like(5, 0, seed=round), standings)[1] == []
    left_out = []
    for _ in range(3):  # then d4's change reversed: its standing carries it one round, no more
        kept, _ = checked_directions(START, speakers_like(5, 1, seed=3), standings)
        left_out.append("d4" not in {r.device_id for r in kept})
    assert left_out == [False, True, True] and standings.of["d4"] < -MIN_AWAY
    results = [*speakers_like(5, 0, seed=3)[:3], a_little_away("d3", 10), a_little_away("d4", 11)]
    cosines = cosines_with_the_others([r.arrays["w"] - 1.0 for r in results])
    assert -MIN_AWAY < cosines[3] < 0 and -MIN_AWAY < cosines[4] < 0, "both a little away this round"
    kept, directions = checked_directions(START, results, standings)
    assert [d.device_id for d in directions] == ["d4"], "d4 on its standing; d3, honest till now, kept"
    assert [r.device_id for r in kept] == ["d0", "d1", "d2", "d3"]


def test_a_standing_averages_a_devices_cosines_the_latest_counting_half():
    standings = Standings()
    assert standings.after({"a": 0.4}) == {"a": 0.4}
    assert standings.after({"a": -0.2, "b": 0.1}) == pytest.approx({"a": 0.1, "b": 0.1})
    assert standings.after({"a": -0.2}) == pytest.approx({"a": -0.05})


def test_nothing_is_left_out_where_the_round_cannot_tell():
    two = speakers_like(2, 1)
    assert checked_directions(START, two) == (two, []), "two changes: each has one other to go by"
    everyone = [Result(f"d{i}", {"w": np.full(3, v, np.float32)}, 1) for i, v in enumerate([2, 0, 0])]
    # from the start 1: changes +1, -1, -1; each points away from the others'
    assert checked_directions({"w": np.ones(3, np.float32)}, everyone) == (everyone, [])
    # unless a device's standing pointed away before: two that agree drag every cosine below 0
    known = Standings({"d0": -0.2})
    assert [d.device_id for d in checked_directions({"w": np.ones(3, np.float32)}, everyone, known)[1]] == [
        "d0"
    ]
    unchanged = [*speakers_like(2, 0), Result("same", START, 10)]  # sent back as received: no direction
    assert checked_directions(START, unchanged) == (unchanged, [])
    broken = [*speakers_like(3, 0), Result("nan", {"w": np.full(20_000, np.nan, np.float32)}, 1)]
    kept, directions = checked_directions(START, broken)
    assert (kept, directions) == (broken, []), "a change that is not finite is the aggregation's to drop"


def test_normalisation_statistics_are_not_compared():
    start = {"w": np.zeros(2, np.float32), "bn.running_mean": np.zeros(2, np.float32)}
    # the same step in the weights; the statistics of one device move the other way, as they may
    results = [
        Result(d, {"w": np.ones(2, np.float32), "bn.running_mean": np.full(2, m, np.float32)}, 1)
        for d, m in [("a", 100.0), ("b", 1.0), ("c", 1.0)]
    ]
    assert checked_directions(start, results)[1] == []


def test_the_coordinator_says_at_start_where_directions_are_not_checked():
    assert direction_unchecked(RoundConfig()) is None
    assert too_few_to_tell(RoundConfig(min_devices=3)) is None
    assert "--min-devices 2" in str(too_few_to_tell(RoundConfig(min_devices=2)))
    assert "--no-direction-check" in str(direction_unchecked(RoundConfig(direction_check=False)))
    assert "secure aggregation" in str(direction_unchecked(RoundConfig(secure_aggregation=True)))
    assert "differential privacy" in str(direction_unchecked(RoundConfig(dp_noise_multiplier=1.0)))


def test_a_round_leaves_out_a_reversed_change_whatever_it_claims(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    fleet = Fleet(tmp_path, rounds=1, min_devices=4, min_results=4, round_timeout=5.0)
    for device, value in [("a", 1.0), ("b", 2.0), ("c", 3.0)]:
        fleet.device(device, value=value, samples=10)
    fleet.device("d", value=-1.0, samples=30)  # the model starts at 0: its change points the other way
    fleet.finish()
    assert fleet.store.rounds()[1].accuracy == pytest.approx(2.0), "FedAvg of a, b and c alone"
    assert sorted(u.device_id for u in fleet.store.updates(1)) == ["a", "b", "c"]
    assert (
        "round 1: d's change points away from the other devices' (cosine -1 with their directions)"
        in caplog.text
    )
    fleet = Fleet(tmp_path / "off", rounds=1, min_devices=4, min_results=4, direction_check=False)
    for device, value in [("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", -1.0)]:
        fleet.device(device, value=value, samples=10)
    fleet.finish()
    assert fleet.store.rounds()[1].accuracy == pytest.approx(1.25)
