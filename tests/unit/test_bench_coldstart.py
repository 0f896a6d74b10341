"""`fedspeech bench coldstart`: the few-shot fleets, the round an arm reaches a target, its report."""

import json
import shutil

import numpy as np
import pytest

from fedspeech_bench.coldstart import ARMS, Curve, first_reached, report, run_coldstart
from fedspeech_bench.coldstart_fleet import DEVICES, MAX_TAKES, MISSING, WORDS, build_fleet
from tests.helpers.shared_data import SHARED_DATA, needs_shared

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="no espeak-ng here")


def test_the_first_round_at_a_target_is_the_first_scored_round_that_reaches_it():
    curve = [(0, 0.1), (1, 0.5), (5, 0.4), (10, 0.6)]
    assert first_reached(curve, 0.5) == 1
    assert first_reached(curve, 0.55) == 10
    assert first_reached(curve, 0.7) is None


def test_the_report_gives_each_arm_its_mean_and_spread_and_the_round_it_reaches_scratchs_final():
    scratch, synthetic = ARMS[0].name, ARMS[1].name
    curves = [
        Curve(scratch, 0, [0, 1, 5, 10, 20], [0.1, 0.2, 0.3, 0.4, 0.5], 100),
        Curve(scratch, 1, [0, 1, 5, 10, 20], [0.1, 0.2, 0.3, 0.4, 0.7], 100),
        Curve(synthetic, 0, [0, 1, 5, 10, 20], [0.5, 0.5, 0.65, 0.7, 0.8], 100),
        Curve(synthetic, 1, [0, 1, 5, 10, 20], [0.5, 0.5, 0.65, 0.7, 0.8], 100),
    ]
    text = report(curves, ARMS[:2], 20, synthetic_only=0.55, pretrain_s=12.0, takes=30)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "scratch's final 0.600" in rows["arm"]
    assert "0.600 ± 0.100" in rows[scratch] and rows[scratch].endswith("| 20 | 0.0 |")
    assert rows[synthetic].endswith("| 5 | 0.0 |"), "0.5 falls short of 0.6 until round 5's 0.65"
    assert "alone it scores 0.550" in text


@needs_shared
def test_a_fleet_has_six_devices_of_few_takes_three_missing_words_and_unseen_speakers_to_score():
    fleet = build_fleet(SHARED_DATA, seed=0)
    assert len(fleet.devices) == DEVICES
    for d, ((waveforms, labels), group) in enumerate(zip(fleet.devices, fleet.speakers, strict=True)):
        takes = np.bincount(labels, minlength=len(WORDS))
        assert takes.max() <= MAX_TAKES and len(waveforms) == len(labels)
        assert np.sum(takes == 0) == (MISSING if d >= DEVICES - 3 else 0)
        assert 1 <= len(group) <= 3
    held = [s for group in fleet.speakers for s in group]
    assert len(held) == len(set(held)), "no speaker on two devices"
    assert 0 < len(fleet.test[1]) <= 1500 and set(fleet.test[1].tolist()) <= set(range(len(WORDS)))
    other = build_fleet(SHARED_DATA, seed=1)
    assert other.speakers != fleet.speakers, "each seed its own fleet"


@needs_shared
@needs_espeak
def test_a_short_run_writes_the_table_the_json_and_the_plot(tmp_path):
    results = run_coldstart(SHARED_DATA, tmp_path, seeds=1, rounds=1, arms=ARMS[:2], takes=2, epochs=1)
    text = results.read_text()
    assert "| from scratch |" in text and "| synthetic start |" in text
    assert (tmp_path / "accuracy-rounds.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "results.json").read_text())
    scratch, synthetic = saved["curves"]
    assert scratch["rounds"] == synthetic["rounds"] == [0, 1]
    assert scratch["accuracies"] != synthetic["accuracies"], "the two arms start from different models"
    assert 0.0 <= saved["synthetic_only"] <= 1.0 and saved["pretrain_s"] > 0 and "made in" in text
    again = run_coldstart(SHARED_DATA, tmp_path, seeds=1, rounds=0, arms=ARMS[:1], takes=2, epochs=1)
    assert "taken from an earlier run's cache" in again.read_text()
