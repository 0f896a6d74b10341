"""`fedspeech bench privacy`: a secure-sum round of each fleet size, timed, its sum checked, reported."""

import json
import math

import pytest

from fedspeech.coordinator.privacy.budget import noise_multiplier_for
from fedspeech_bench.dp_curve import RATES, CurvePoint, CurveSetting, fleet_sizes, sizes_table
from fedspeech_bench.label_attack import run_attack
from fedspeech_bench.privacy import CurveOptions, measure, run_privacy_bench
from tests.helpers.shared_data import SHARED_DATA, needs_shared


def test_a_round_is_measured_and_costs_more_than_plain_fedavg():
    costs = measure(5, 2000)
    assert costs.threshold == 3
    assert set(costs.device_ms) == {"advert", "share", "mask", "unmask"}
    assert all(ms > 0 for ms in costs.device_ms.values())
    assert costs.coordinator_ms > 0
    # the masked vector is as long as the plain one; keys and shares come on top
    assert costs.plain_sent_bytes == 4 * 2000 < costs.sent_bytes < 4 * 2000 + 1000


@needs_shared
def test_the_report_has_a_row_a_size_the_attack_the_curve_and_their_plots(tmp_path):
    curve = CurveOptions(SHARED_DATA, (8.0,), rounds=2, sampling_rate=0.02, norm_bound_quantile=0.5)
    results = run_privacy_bench(tmp_path, [3, 4], 500, attack_devices=6, curve=curve)
    text = results.read_text()
    assert "| 3 | 2 |" in text and "| 4 | 3 |" in text and "label inference" in text
    assert "accuracy against epsilon" in text and "fleet size each epsilon needs" in text
    for plot in ("secure-sum-costs.png", "label-inference.png", "accuracy-epsilon.png"):
        assert (tmp_path / plot).stat().st_size > 1000
    report = json.loads((tmp_path / "results.json").read_text())
    assert [row["devices"] for row in report["costs"]] == [3, 4]
    assert len(report["attack"]) == 5, "four views, and one under differential privacy"
    no_noise, noisy, adapting = report["curve"]["points"]
    assert no_noise["epsilon"] is None and noisy["epsilon"] == pytest.approx(8.0, rel=1e-3)
    assert adapting["epsilon"] == noisy["epsilon"] and adapting["norm_bound_quantile"] == 0.5
    assert adapting["last_norm_bound"] != 1.0 and noisy["last_norm_bound"] == 1.0, (
        "only the adapting bound moves"
    )
    assert "adapting to the 0.5 quantile" in text
    assert report["curve"]["setting"]["devices"] >= 100


def test_the_fleet_an_epsilon_needs_keeps_each_arms_noise_on_the_step():
    setting = CurveSetting(devices=200, clips=3000, sampling_rate=0.2, rounds=30, norm_bound=1.0)
    points = [
        CurvePoint(0.0, None, 0.40, [30], [0.40]),
        CurvePoint(2.0, 2.0, 0.10, [30], [0.10]),
        CurvePoint(0.2, 300.0, 0.37, [30], [0.37]),
    ]
    rows = fleet_sizes(setting, points, [1.0, 4.0])
    assert [point.noise_multiplier for point, _ in rows] == [2.0, 0.2], "the arms with noise"
    for point, needs in rows:
        step = point.noise_multiplier / 40  # the arm's noise on the mean step: 40 expected devices
        assert needs[0][0] > needs[1][0], "a smaller epsilon needs a larger fleet"
        for epsilon, (n, rate) in zip([1.0, 4.0], needs, strict=True):
            z = noise_multiplier_for(epsilon, setting.delta, rate, 30)  # what epsilon asks at that rate
            assert z / (rate * n) <= step < z / (rate * (n - 1)), "the fewest devices at that rate"
            for other in RATES:  # and no other rate needs fewer
                assert (
                    math.ceil(noise_multiplier_for(epsilon, setting.delta, other, 30) / (other * step)) >= n
                )
    assert rows[1][1][0][0] > rows[0][1][0][0], "less noise on the step needs a larger fleet"
    assert "| 0.0050 | 0.370 | 4,432 (q 1) |" in sizes_table(setting, rows, [1.0, 4.0])


def test_the_attack_reads_labels_from_plain_updates_and_not_from_what_secure_aggregation_shows():
    scores = {s.view: s.accuracy for s in run_attack(devices=12, seed=1)}
    baseline = scores["always present (no attack)"]
    assert baseline == 0.6  # 4 of 10 digits missing on every device
    assert scores["plain FedAvg: each device's update"] >= 0.85
    assert abs(scores["secure aggregation: each device's masked vector"] - 0.5) < 0.15, "a coin toss"
    assert scores["secure aggregation: the round's sum"] <= baseline + 0.1


def test_under_differential_privacy_the_attack_reads_no_more_than_a_coin_toss():
    noise = {"dp": 0.5}  # far less noise than any epsilon of the curve asks for
    scores = {s.view: s.accuracy for s in run_attack(devices=12, seed=1, noise=noise, norm_bound=1.0)}
    assert abs(scores["dp"] - 0.5) < 0.15
