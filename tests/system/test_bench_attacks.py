"""`fedspeech bench attacks` end to end, short: a clean live deployment and one with a compromised device.

Every process is real: the coordinator, five device daemons and the compromised one, on the coordinator's
embedded broker. Two rounds of one epoch teach the model little, so the accuracy drift says nothing here:
what is asserted is that the attack ran (the device was bounded every round and its faked report refused)
and that the table, the plot and the results were written.
"""

import json
import subprocess
import sys

import pytest


@pytest.mark.timeout(900)
def test_bench_attacks_runs_a_compromised_device_against_a_clean_deployment(tmp_path):
    out = tmp_path / "attacks"
    command = [sys.executable, "-m", "fedspeech", "bench", "attacks", "--rounds", "2", "--epochs", "1"]
    command += ["--attack", "compromised_device", "--out", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=840)
    assert run.returncode == 0, run.stderr[-3000:]
    print(run.stdout)
    clean, attacked = json.loads((out / "results.json").read_text())
    assert (clean["attack"], attacked["attack"]) == ("none", "compromised_device")
    for arm in (clean, attacked):
        assert arm["finished"] and [r["round"] for r in arm["rounds"]] == [0, 1, 2]
        assert arm["watch"]["rss_peak"] >= arm["watch"]["rss_start"] > 0
        assert arm["watch"]["statuses"] > 0 and arm["watch"]["failed_statuses"] == 0
    assert all(r["results"] == 6 for r in clean["rounds"][1:]), "every device in every round"
    # the compromised device's change is bounded every round, and left out where it points away
    assert all(r["results"] in (5, 6) for r in attacked["rounds"][1:])
    # bounded in both rounds; its faked report of the last round (the only one evaluated) refused
    assert attacked["evidence"]["tried"] == 3 and attacked["evidence"]["refused"] == 1
    assert clean["rounds"][0]["weights_sha256"] == attacked["rounds"][0]["weights_sha256"]
    assert clean["rounds"][2]["weights_sha256"] != attacked["rounds"][2]["weights_sha256"], "it did attack"
    rows = (out / "table.md").read_text().splitlines()
    assert rows[2].startswith("| none | - |") and rows[3].startswith("| compromised_device | ")
    assert (out / "attacks.png").stat().st_size > 10_000
    insider = (out / "compromised_device" / "logs" / "pi4-d.log").read_text()
    assert "Traceback" not in insider
