"""`fedspeech bench privacy`: a secure-sum round of each fleet size, timed, its sum checked, reported."""

import json

from fedspeech_bench.privacy import measure, run_privacy_bench


def test_a_round_is_measured_and_costs_more_than_plain_fedavg():
    costs = measure(5, 2000)
    assert costs.threshold == 3
    assert set(costs.device_ms) == {"advert", "share", "mask", "unmask"}
    assert all(ms > 0 for ms in costs.device_ms.values())
    assert costs.coordinator_ms > 0
    # the masked vector is as long as the plain one; keys and shares come on top
    assert costs.plain_sent_bytes == 4 * 2000 < costs.sent_bytes < 4 * 2000 + 1000


def test_the_report_has_a_row_a_size_and_a_plot(tmp_path):
    results = run_privacy_bench(tmp_path, [3, 4], 500)
    text = results.read_text()
    assert "| 3 | 2 |" in text and "| 4 | 3 |" in text
    assert (tmp_path / "secure-sum-costs.png").stat().st_size > 1000
    assert [row["devices"] for row in json.loads((tmp_path / "results.json").read_text())] == [3, 4]
