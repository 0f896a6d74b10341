"""The benchmarks' summary, statistics and report on hand-made runs (no training)."""

import argparse
import math
from dataclasses import asdict, replace
from dataclasses import fields as dataclass_fields

import pytest
from scipy import stats

from fedspeech.coordinator.strategies.krum import Krum
from fedspeech.defence_options import defence_options
from fedspeech_bench.commands import add_bench_parser, add_demo_parser
from fedspeech_bench.fleets.fleet_files import FLEETS_DIR, load_fleet
from fedspeech_bench.harness import (
    arm_config,
    arm_rounds,
    growing_config,
    poisoning_config,
    strategies_config,
)
from fedspeech_bench.report.plots import write_plots
from fedspeech_bench.report.summaries import summarize, welch
from fedspeech_bench.report.tables import markdown_table
from fedspeech_bench.runs import Run
from tests.helpers.bench_runs import made_up_run


def _run(arm: str, seed: int, accuracies: list[float], round_s: float, mb_per_round: float) -> Run:
    return made_up_run("fsdd", arm, seed, accuracies, round_s, mb_per_round)


RUNS = [
    _run("fedavg", 0, [0.5, 0.8, 0.90], 10.0, 2.0),
    _run("fedavg", 1, [0.5, 0.7, 0.92], 10.0, 2.0),
    _run("fedavg", 2, [0.6, 0.9, 0.94], 10.0, 2.0),
    _run("hardware", 0, [0.7, 0.9, 0.93], 4.0, 1.0),
    _run("hardware", 1, [0.6, 0.85, 0.95], 4.0, 1.0),
    _run("hardware", 2, [0.8, 0.9, 0.97], 4.0, 1.0),
]


def test_summary_by_hand():
    fedavg, hardware = summarize(RUNS, target=0.85, baseline="fedavg")
    assert (fedavg.arm, hardware.arm) == ("fedavg", "hardware")
    assert fedavg.accuracy_mean == pytest.approx(0.92)
    assert fedavg.accuracy_std == pytest.approx(0.02)
    assert hardware.accuracy_mean == pytest.approx(0.95)
    # fedavg reaches 0.85 at 30 s, 30 s and 20 s; hardware at 8 s, 8 s and 8 s
    assert fedavg.time_to_target_s == pytest.approx(80 / 3) and fedavg.reached_target == 3
    assert hardware.time_to_target_s == pytest.approx(8.0)
    assert fedavg.rounds_to_target == pytest.approx(8 / 3) and hardware.rounds_to_target == 2.0
    assert fedavg.wall_s == 30.0 and hardware.wall_s == 12.0
    assert hardware.bytes_total == pytest.approx(3e6) and fedavg.bytes_total == pytest.approx(6e6)
    expected_p = stats.ttest_ind([0.93, 0.95, 0.97], [0.90, 0.92, 0.94], equal_var=False).pvalue
    assert hardware.p_vs_baseline == pytest.approx(expected_p)
    assert hardware.d_vs_baseline == pytest.approx(0.03 / 0.02)  # both SDs 0.02
    # to the final accuracy of FedAvg's run of the same seed (0.90, 0.92, 0.94): fedavg's own in their
    # last rounds (30 s, 6 MB); hardware's seed 0 reaches 0.90 in round 2 (8 s, 2 MB), the others in 3
    assert (fedavg.reached_baseline, hardware.reached_baseline) == (3, 3)
    assert fedavg.time_to_baseline_s == 30.0 and fedavg.bytes_to_baseline == pytest.approx(6e6)
    assert hardware.time_to_baseline_s == pytest.approx(32 / 3)
    assert hardware.bytes_to_baseline == pytest.approx(8e6 / 3)


def test_unreached_target_and_report(tmp_path):
    rows = summarize(RUNS, target=0.96, baseline="fedavg")
    assert rows[0].time_to_target_s is None and rows[0].reached_target == 0
    assert rows[1].reached_target == 1
    table = markdown_table("fsdd", rows, 0.96, "pi-mix", "fedavg")
    assert "| hardware | 3 | 0.9500 ± 0.0200 | 3.0 (1/3) | 12.0 (1/3) | - |" in table
    assert "| fedavg | 3 | 0.9200 ± 0.0200 | - | not reached |" in table
    assert "| 0.40x |" in table and "| 0.50x |" in table  # wall and bytes against FedAvg
    assert "To the final accuracy of fedavg's run of the same seed" in table
    assert "| hardware | 3/3 | 10.7 | 0.36x | 2.67 | 0.44x |" in table
    for png in write_plots("fsdd", RUNS, rows, tmp_path):
        assert png.read_bytes().startswith(b"\x89PNG")


def test_run_reads_back_from_its_dict():
    import json

    run = RUNS[3]
    again = Run.from_dict(json.loads(json.dumps(asdict(run))))
    assert again == run and again.time_to(0.85) == run.time_to(0.85)


def test_runs_that_end_exactly_alike_give_no_test():
    assert all(math.isnan(x) for x in welch([0.2, 0.2], [0.3, 0.3])), "no spread: no p, no d"
    assert all(math.isnan(x) for x in welch([0.2], [0.3, 0.4])), "one value: no test"
    p, d = welch([0.2, 0.3], [0.2, 0.2])
    assert 0 < p < 1 and d == pytest.approx(0.05 / math.sqrt(0.005 / 2))


def test_float16_arms_run_a_strategy_with_half_precision_weights(tmp_path):
    cfg = strategies_config(tmp_path, ["fedavg", "time_budget"], k=2, float16=["time_budget"])
    assert [(a.name, dict(a.settings)) for a in cfg.arms] == [
        ("fedavg", {"strategy": "fedavg", "k": 2}),
        ("time_budget", {"strategy": "time_budget", "k": 2}),
        ("time_budget_float16", {"strategy": "time_budget", "k": 2, "precision": "float16"}),
    ]
    with pytest.raises(ValueError, match="unknown strategies"):
        strategies_config(tmp_path, ["fedavg"], float16=["fastest"])


def test_every_arm_is_the_coordinators_config_with_its_settings(tmp_path):
    growing = growing_config(tmp_path)
    benches = [strategies_config(tmp_path, float16=["fedavg"]), poisoning_config(tmp_path), growing]
    benches.append(replace(growing, corpora=["speech_commands"]))  # its own strategy: random K of 30
    for cfg in benches:
        for corpus in cfg.corpora:
            settings = cfg.corpus_settings.get(corpus, {})
            for arm in cfg.arms:
                config = arm_config(cfg, corpus, arm)
                parts = (config.service, config.rounds, config.evaluation)
                fields = {f.name: getattr(part, f.name) for part in parts for f in dataclass_fields(part)}
                assert {name: fields[name] for name in {**settings, **arm.settings}} == {
                    **settings,
                    **arm.settings,
                }
    sampled = arm_config(growing, "speech_commands", growing.arms[0])
    assert (sampled.rounds.strategy, sampled.rounds.k, sampled.service.model) == (
        "random_k",
        30,
        "transformer",
    )


def test_a_buffered_strategy_runs_as_many_rounds_as_aggregate_as_many_results(tmp_path):
    # pi-mix: six devices; a fedbuff round aggregates about K of them, a fedavg round all six
    cfg = strategies_config(tmp_path, ["fedavg", "fedbuff"], k=4, float16=["fedbuff"], rounds=20)
    assert [arm_rounds(cfg, "fsdd", arm) for arm in cfg.arms] == [20, 30, 30]
    cfg = strategies_config(tmp_path, ["fedbuff"], k=10, rounds=20)
    assert arm_rounds(cfg, "fsdd", cfg.arms[0]) == 20, "K above the fleet's size: every device, every round"


def test_central_with_a_speaker_left_out_scores_on_all_of_that_speakers_clips():
    from fedspeech.models.clips.datasets import load_corpus, server_test_clips
    from fedspeech_bench.central import central_split

    fsdd = load_corpus("fsdd")
    train, test = central_split(fsdd, "george")
    assert {c.speaker for c in test} == {"george"} and len(test) == 500
    assert "george" not in {c.speaker for c in train} and not any(c.test for c in train)
    train, test = central_split(fsdd)
    assert test == server_test_clips(fsdd) and len(train) + len(test) == len(fsdd.clips)


def test_strategies_without_names_skips_what_the_corpora_cannot_serve_and_says_why(tmp_path, caplog):
    cfg = strategies_config(tmp_path, corpora=["fsdd"])
    arms = {arm.name for arm in cfg.arms}
    assert {"fedavg", "fedprox", "hardware", "krum", "fedbuff"} <= arms
    assert not {"quality", "mkd", "fedbn", "silobn", "fedbuff_silobn"} & arms
    assert "skips quality: it needs a validation set" in caplog.text
    assert "skips fedbn: it needs a model with batch normalisation, and fsdd's default" in caplog.text


def test_strategies_refuses_a_named_strategy_it_cannot_serve_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="mkd needs clips of the coordinator's own"):
        strategies_config(tmp_path, ["fedavg", "mkd"], corpora=["fsdd"])
    with pytest.raises(ValueError, match="fedbn needs a model with batch normalisation"):
        strategies_config(tmp_path, ["fedavg"], float16=["fedbn"], corpora=["fsdd"])
    few = {"fsdd": load_fleet(FLEETS_DIR / "pi-mix.toml")[:1]}
    with pytest.raises(ValueError, match="krum needs 5 results a round, and the fsdd fleet has"):
        strategies_config(tmp_path, ["krum"], corpora=["fsdd"], fleets=few)


def test_poisoning_arms_take_a_strategys_settings_and_refuse_bad_ones(tmp_path):
    cfg = poisoning_config(tmp_path, ["median", "krum:m=0,f=1"])
    multi = arm_config(cfg, "fsdd", cfg.arms[-2])
    assert [a.name for a in cfg.arms[2:]] == [
        "attacked-median", "attacked-krum:m=0,f=1", "attacked-fedavg-unbounded"
    ]  # fmt: skip
    assert arm_config(cfg, "fsdd", cfg.arms[-1]).rounds.norm_bound == "off"
    assert (multi.rounds.strategy, multi.rounds.strategy_settings) == ("krum", Krum.Params(f=1, m=0))
    bad_arms = [("krum:m=-1", "m must be between"), ("krum:q=1", "unknown setting 'q'"), ("kram", "kram")]
    for bad, why in bad_arms:
        with pytest.raises(ValueError, match=why):
            poisoning_config(tmp_path, [bad])


def test_inference_engines_take_turns_in_blocks_each_with_every_window():
    import numpy as np

    from fedspeech_bench.inference import BLOCK, latencies

    calls: list[str] = []
    engines = {name: (lambda window, name=name: calls.append(name)) for name in ("fp32", "int8")}
    times = latencies(engines, np.zeros((30, 4), np.float32), repeats=BLOCK + 10)
    assert {name: len(t) for name, t in times.items()} == {"fp32": BLOCK + 10, "int8": BLOCK + 10}
    timed = calls[2 * 20 :]  # after 20 warm-up calls each
    assert timed == ["fp32"] * BLOCK + ["int8"] * BLOCK + ["fp32"] * 10 + ["int8"] * 10


def test_a_new_demo_fleet_forgets_keys_and_tokens_but_keeps_its_synthetic_speech(tmp_path):
    from fedspeech_bench.demo import fresh_state

    made = [
        "state/coordinator.key", "state/state.sqlite3", "state/models/1.onnx", "state/synthetic/a/0/t.flac",
        "state/pretrained/b.safetensors", "devices/pi4-a/token", "devices/pi4-a/synthetic/c/0/t.flac",
    ]  # fmt: skip
    for name in made:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    fresh_state(tmp_path)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == [
        "devices/pi4-a/synthetic/c/0/t.flac", "state/pretrained/b.safetensors", "state/synthetic/a/0/t.flac",
    ]  # fmt: skip
    fresh_state(tmp_path / "nothing yet")  # a first run: nothing to forget


def test_the_defence_options_reach_the_demo_and_every_arm_and_a_bad_bound_is_refused():
    parser = argparse.ArgumentParser()
    subcommands = parser.add_subparsers()
    add_bench_parser(subcommands)
    add_demo_parser(subcommands)
    off = parser.parse_args(["bench", "strategies", "--norm-bound", "off", "--no-direction-check"])
    assert defence_options(off) == {"norm_bound": "off", "direction_check": False}
    assert defence_options(parser.parse_args(["demo", "--norm-bound", "2.5"])) == {"norm_bound": 2.5}
    assert defence_options(parser.parse_args(["demo"])) == {}, "left out: the coordinator's defaults"
    with pytest.raises(ValueError, match="norm_bound must be median, off or a positive number"):
        defence_options(parser.parse_args(["demo", "--norm-bound", "big"]))
    with pytest.raises(SystemExit, match="^fedspeech demo: norm_bound must be"):
        args = parser.parse_args(["demo", "--norm-bound", "-1"])
        args.run(args)
