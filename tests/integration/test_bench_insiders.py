"""`fedspeech bench insiders`, short: one reversed device of three, one round, the coordinator's rules."""

import json

from fedspeech_bench.attacks.insider_rounds import Arm, run_insiders, write_insiders


def test_a_reversed_device_is_left_out_and_the_fleet_is_the_one_without_it(tmp_path):
    runs = run_insiders([Arm(3, 1, "reversed"), Arm(3, 1, "reversed", direction_check=False)], rounds=1)
    (checked, clean, without), (unchecked, _, _) = runs
    assert (checked.arm.name, clean.arm.name, without.arm.name) == (
        "1 of 3 reversed from 1, fedavg", "3 clean, fedavg", "2 clean, fedavg",
    )  # fmt: skip
    assert checked.left_out == 1 and unchecked.left_out == 0
    assert checked.accuracies == without.accuracies, "the two honest devices' FedAvg, bit for bit"
    assert unchecked.accuracies != without.accuracies, "unchecked, the reversed change counts"
    text = write_insiders(tmp_path, runs)
    assert text.splitlines()[2].startswith("| 1 of 3 reversed from 1, fedavg | ")
    assert "| 1 of 1 |" in text.splitlines()[2]
    assert len(json.loads((tmp_path / "results.json").read_text())) == 2
    assert (tmp_path / "insiders.png").stat().st_size > 10_000
