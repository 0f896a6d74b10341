"""`fedspeech bench privacy`: a secure-sum round of each fleet size, timed, its sum checked, reported."""

import json

from fedspeech_bench.label_attack import run_attack
from fedspeech_bench.privacy import measure, run_privacy_bench


def test_a_round_is_measured_and_costs_more_than_plain_fedavg():
    costs = measure(5, 2000)
    assert costs.threshold == 3
    assert set(costs.device_ms) == {"advert", "share", "mask", "unmask"}
    assert all(ms > 0 for ms in costs.device_ms.values())
    assert costs.coordinator_ms > 0
    # the masked vector is as long as the plain one; keys and shares come on top
    assert costs.plain_sent_bytes == 4 * 2000 < costs.sent_bytes < 4 * 2000 + 1000


def test_the_report_has_a_row_a_size_the_attack_and_their_plots(tmp_path):
    results = run_privacy_bench(tmp_path, [3, 4], 500, attack_devices=6)
    text = results.read_text()
    assert "| 3 | 2 |" in text and "| 4 | 3 |" in text and "label inference" in text
    assert (tmp_path / "secure-sum-costs.png").stat().st_size > 1000
    assert (tmp_path / "label-inference.png").stat().st_size > 1000
    report = json.loads((tmp_path / "results.json").read_text())
    assert [row["devices"] for row in report["costs"]] == [3, 4]
    assert len(report["attack"]) == 4


def test_the_attack_reads_labels_from_plain_updates_and_not_from_what_secure_aggregation_shows():
    scores = {s.view: s.accuracy for s in run_attack(devices=12, seed=1)}
    baseline = scores["always present (no attack)"]
    assert baseline == 0.6  # 4 of 10 digits missing on every device
    assert scores["plain FedAvg: each device's update"] >= 0.85
    assert abs(scores["secure aggregation: each device's masked vector"] - 0.5) < 0.15, "a coin toss"
    assert scores["secure aggregation: the round's sum"] <= baseline + 0.1
