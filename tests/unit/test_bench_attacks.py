"""`fedspeech bench attacks`' verdicts, parity count and table on hand-made arms (no fleet)."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from fedspeech.coordinator.state.records import RoundRecord
from fedspeech.edge_client.local_data import Split
from fedspeech.protocol import messages
from fedspeech.protocol.messages import EvaluationReport
from fedspeech_bench.attacks.bench import Arm, same_models, table, verdict
from fedspeech_bench.attacks.catalogue import ATTACKS, Evidence
from fedspeech_bench.attacks.live_fleet import MiB, Watch
from fedspeech_bench.fleets.poisoning import AttackingTrainer


def _rounds(accuracy: float, round_s: float, models: str = "abc") -> list[RoundRecord]:
    return [
        RoundRecord(r, 0.0, round_s, round_s, 6, 6, accuracy, None, None, 0, 0, models[r]) for r in range(3)
    ]


def _arm(attack: str, accuracy: float = 0.9, round_s: float = 5.0, models: str = "abc", **seen) -> Arm:
    watch = Watch(rss_start=500 * MiB, rss_peak=seen.pop("rss_mib", 520) * MiB)
    watch.slowest_status_s = seen.pop("status_s", 0.5)
    evidence = Evidence(seen.pop("tried", 0), seen.pop("refused", 0))
    return Arm(attack, _rounds(accuracy, round_s, models), watch, evidence, seen.pop("finished", True))


CLEAN = _arm("none")


def test_every_attempt_turned_away_with_the_fleet_unharmed_is_refused():
    attack = ATTACKS["bad_requests"]
    assert verdict(attack, _arm("bad_requests", tried=40, refused=40), CLEAN) == "refused"
    assert verdict(attack, _arm("bad_requests", tried=40, refused=39), CLEAN) == "defended"
    assert verdict(attack, _arm("bad_requests"), CLEAN) == "defended", "accepted, and of no effect"


def test_a_fleet_that_drifted_is_not_defended_whatever_was_refused():
    attack, refused = ATTACKS["compromised_device"], {"tried": 10, "refused": 10}
    assert verdict(attack, _arm(attack.name, accuracy=0.8799, **refused), CLEAN) == "not defended"
    assert verdict(attack, _arm(attack.name, accuracy=0.8801, **refused), CLEAN) == "refused"
    assert verdict(attack, _arm(attack.name, round_s=8.5, **refused), CLEAN) == "not defended"
    assert verdict(attack, _arm(attack.name, rss_mib=720, **refused), CLEAN) == "not defended"
    assert verdict(attack, _arm(attack.name, status_s=1.6, **refused), CLEAN) == "not defended"
    assert verdict(attack, _arm(attack.name, finished=False, **refused), CLEAN) == "not defended"
    lost_a_round = replace(_arm(attack.name, **refused), rounds=_rounds(0.9, 5.0)[:2])
    assert verdict(attack, lost_a_round, CLEAN) == "not defended"


def test_an_attack_that_could_not_be_mounted_is_said_to_have_failed():
    failed = _arm("rollback")
    failed.evidence.failed = "no such file"
    assert verdict(ATTACKS["rollback"], failed, CLEAN) == "attack failed", "not defended, nor held"


def test_a_forged_online_device_may_cost_a_round_its_acknowledgement_timeout():
    attack = ATTACKS["forged_online"]
    assert verdict(attack, _arm(attack.name, round_s=15.0), CLEAN) == "defended"
    assert verdict(attack, _arm(attack.name, round_s=18.5), CLEAN) == "not defended"


def test_rounds_with_the_clean_runs_model_are_counted_after_round_zero():
    assert same_models(_arm("x", models="abc"), CLEAN) == 2
    assert same_models(_arm("x", models="abd"), CLEAN) == 1
    assert same_models(_arm("x", models="xyz"), CLEAN) == 0


def test_the_table_has_a_row_per_arm_with_its_drift_and_verdict():
    arms = [CLEAN, _arm("compromised_device", accuracy=0.85, tried=5, refused=2, models="axy")]
    arms[1].evidence.notes.append("2 faked reports refused")
    lines = table(arms).splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| none | - | 0.9000 (+0.0000) | 5.00 (+0.00) | 520.0 (+0.0) |")
    assert "| compromised_device | not defended | 0.8500 (-0.0500) |" in lines[3]
    assert lines[3].endswith("| 0 of 2 | 2 of 5 refused; 2 faked reports refused |")


def test_an_attack_on_secure_aggregation_is_measured_against_the_clean_run_under_it():
    secure_clean = _arm("none_secure", accuracy=0.8, round_s=8.0)
    unbounded = _arm("secure_unbounded", accuracy=0.79, round_s=9.0)
    lines = table([CLEAN, secure_clean, unbounded]).splitlines()
    assert "| none_secure | - | 0.8000 (+0.0000) | 8.00 (+0.00) |" in lines[3]
    assert "| secure_unbounded | defended | 0.7900 (-0.0100) | 9.00 (+1.00) |" in lines[4]


def test_the_compromised_device_reports_a_billion_correct_clips_of_every_label():
    task = SimpleNamespace(task_id="t1", round=3, spec=SimpleNamespace(num_classes=11))
    trainer = AttackingTrainer("mallory", attack="scaled_global")
    report = messages.decode(trainer.evaluate(task, {}, None), EvaluationReport)  # no clips needed to lie
    assert (report.task_id, report.round) == ("t1", 3)
    assert np.array_equal(np.array(report.confusion), np.diag([10**9] * 11))


def test_the_compromised_device_is_honest_before_its_first_round_of_attack():
    trainer = AttackingTrainer("mallory", attack="scaled_global", from_round=4)
    no_clips = Split(np.zeros((0, 8000), np.float32), np.zeros(0, np.int64), {})
    for round, faked in ((3, False), (4, True)):
        task = SimpleNamespace(task_id="t1", round=round, spec=SimpleNamespace(num_classes=11), config={})
        report = messages.decode(trainer.evaluate(task, {}, no_clips), EvaluationReport)
        assert (np.array(report.confusion).sum() == 11 * 10**9) == faked
