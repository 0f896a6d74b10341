"""`bench seeds` without training: its data folders and deals, its tables, and its checks of names."""

import argparse
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from scipy import stats

from fedspeech.coordinator.config import CoordinatorConfig
from fedspeech.models.clips.datasets import SILENCE_SPEAKER, load_corpus
from fedspeech.models.clips.folders import list_folder
from fedspeech_bench import seeds as bench_seeds
from fedspeech_bench.bench_config import SEEDS_ARMS, SeedsConfig
from fedspeech_bench.fleets.fleet_files import DEFAULT_FLEETS, DeviceSpec, load_fleet
from fedspeech_bench.report.summaries import summarize
from fedspeech_bench.report.tables import loso_goal, loso_table, personalised_line, skewed_goal, table2
from fedspeech_bench.runs import Run
from fedspeech_bench.seeds import add_parser, arm_for, check_arms, check_config
from fedspeech_bench.splits import (
    Setting,
    folder_train_clips,
    loso_settings,
    skewed_deal,
    skewed_setting,
    validation_clips,
    within_setting,
)
from tests.helpers.bench_runs import made_up_run
from tests.helpers.shared_data import SHARED_DATA, needs_shared


def _linked(folder: Path) -> dict[Path, str]:
    """Each file a folder of links points at, with the label folder it sits in."""
    return {link.resolve(): link.parent.name for link in folder.glob("*/*")}


def _run(corpus: str, arm: str, seed: int, accuracies: list[float], round_s: float = 10.0) -> Run:
    return made_up_run(corpus, arm, seed, accuracies, round_s)


@needs_shared
def test_loso_folds_hold_exactly_the_held_out_speaker_and_leave_its_device_out(tmp_path):
    corpus = load_corpus("emodb", SHARED_DATA)
    fleet = load_fleet(DEFAULT_FLEETS["emodb"])
    folds = loso_settings(corpus, fleet, tmp_path, folds=2)
    assert [f.held_out for f in folds] == ["03", "08"]  # the first two speakers in sorted order
    for fold in folds:
        own = {c.path.resolve(): corpus.labels[c.label] for c in corpus.clips if c.speaker == fold.held_out}
        assert _linked(fold.settings["eval_data"]) == own
        assert fold.settings["eval_corpus"] is None
        assert fold.held_out not in {spec.speaker for spec in fold.fleet}
        assert len(fold.fleet) == len(fleet) - 1
        # the shared validation clips: training clips of the fold's training speakers only
        by_path = {c.path.resolve(): c for c in corpus.clips}
        shared = [by_path[path] for path in _linked(fold.validation)]
        assert shared and not any(c.test or c.speaker == fold.held_out for c in shared)
        assert max(Counter((c.speaker, c.label) for c in shared).values()) == 2


@needs_shared
def test_skewed_deal_is_fixed_disjoint_and_evaluates_on_speakers_no_device_holds():
    corpus = load_corpus("speech_commands", SHARED_DATA)
    deal = skewed_deal(corpus)
    assert deal == skewed_deal(load_corpus("speech_commands", SHARED_DATA))
    assert len(deal.devices) == 6
    held = [set(speakers) for speakers in deal.speakers]
    for i, mine in enumerate(held):
        assert not mine & set().union(*held[:i], *held[i + 1 :])  # each speaker on one device
        assert {c.speaker for c in deal.devices[i]} <= mine | {SILENCE_SPEAKER}
    assert not set(deal.evaluation_speakers) & set().union(*held)
    assert {c.speaker for c in deal.evaluation} <= set(deal.evaluation_speakers) | {SILENCE_SPEAKER}
    dealt = {c.path for clips in deal.devices for c in clips}
    assert not dealt & {c.path for c in deal.evaluation}  # nor are silence clips shared
    present = [{corpus.labels[c.label] for c in clips} for clips in deal.devices]
    assert [bool(lacks) for lacks in deal.lacking] == [False] * 3 + [True] * 3
    for labels, lacks in zip(present, deal.lacking, strict=True):
        assert labels == set(corpus.labels) - set(lacks)
        assert len(lacks) in (0, 4)
    assert {c.label for c in deal.evaluation} == set(range(len(corpus.labels)))


@needs_shared
def test_skewed_setting_gives_devices_folders_and_shares_only_training_clips(tmp_path):
    corpus = load_corpus("speech_commands", SHARED_DATA)
    setting, deal = skewed_setting(corpus, tmp_path)
    assert [spec.data is not None and spec.speaker == "" for spec in setting.fleet] == [True] * 6
    train = set()
    for spec, clips in zip(setting.fleet, deal.devices, strict=True):
        assert spec.data is not None
        listed, skipped = list_folder(spec.data, corpus.labels)
        assert not skipped and len(listed) == len(clips)
        # the device's own split of its folder is the one the bench assumes
        assert {c.path.resolve() for c in listed if not c.test} == {
            c.path.resolve() for c in folder_train_clips(clips, corpus.labels)
        }
        train |= {c.path.resolve() for c in listed if not c.test}
    shared = _linked(setting.validation)
    assert shared and set(shared) <= train
    assert _linked(setting.settings["eval_data"]) == {
        c.path.resolve(): corpus.labels[c.label] for c in deal.evaluation
    }


def test_within_validation_folder_holds_two_training_clips_per_device_and_label(tmp_path):
    corpus = load_corpus("fsdd")
    fleet = load_fleet(DEFAULT_FLEETS["fsdd"])
    setting = within_setting("fsdd-within", corpus, fleet, tmp_path)
    by_path = {c.path.resolve(): c for c in corpus.clips}
    shared = [by_path[path] for path in _linked(setting.validation)]
    assert not any(c.test for c in shared)
    assert Counter((c.speaker, c.label) for c in shared) == {
        (spec.speaker, label): 2 for spec in fleet for label in range(len(corpus.labels))
    }


def test_validation_clips_take_what_a_device_has():
    clips = [c for c in load_corpus("fsdd").clips if c.speaker == "george" and not c.test]
    few = [c for c in clips if c.label == 3][:1] + [c for c in clips if c.label == 5]
    chosen = validation_clips({"a": few})
    assert [c.label for c in chosen] == [3, 5, 5]


def test_arms_get_their_folders_and_fedbn_its_personal_evaluation(tmp_path):
    within = Setting("fsdd-within", "fsdd-within", "fsdd", [], {}, tmp_path, personalised=True)
    held = Setting("emodb-loso-03", "emodb-loso", "emodb", [], {"eval_data": Path("x")}, tmp_path)
    assert arm_for("quality", within).settings["validation_data"] == tmp_path
    assert arm_for("mkd", within).settings["server_data"] == tmp_path
    assert "eval_corpus" not in arm_for("fedbn", within).settings, "the global model is scored as well"
    assert arm_for("fedbn", within).settings["eval_every"] == 1
    assert arm_for("fedbn", held).settings == {"strategy": "fedbn", "model": "cnn_bn"}
    settings = arm_for("grouped-N", held).settings
    assert settings["strategy"] == "grouped" and settings["strategy_settings"].groups == 0
    # each arm's settings are fields of the coordinator's config, and within its bounds
    for name in SEEDS_ARMS:
        config = CoordinatorConfig().changed(**arm_for(name, held).settings)
        assert config.rounds.strategy == SEEDS_ARMS[name]["strategy"]


def test_unknown_arms_and_unregistered_strategies_fail_at_config_time(tmp_path):
    with pytest.raises(ValueError, match=r"unknown arms \['fedsgd'\]"):
        check_arms(["fedavg", "fedsgd"])
    from fedspeech.coordinator import strategies

    registered = dict(strategies.STRATEGIES)
    del strategies.STRATEGIES["fedprox"]
    try:
        with pytest.raises(
            ValueError, match="arm 'fedprox' needs strategy 'fedprox', which is not registered"
        ):
            check_config(SeedsConfig(tmp_path, splits=["fsdd-within"], arms=["fedavg", "fedprox"]))
    finally:  # in its order: the registry's order is the order `fedspeech strategies` lists them in
        strategies.STRATEGIES.clear()
        strategies.STRATEGIES.update(registered)
    with pytest.raises(ValueError, match="unknown splits"):
        check_config(SeedsConfig(tmp_path, splits=["timit"], arms=["fedavg"]))
    with pytest.raises(ValueError, match="emodb need --data-dir"):
        check_config(SeedsConfig(tmp_path, splits=["emodb-loso"], arms=["fedavg"]))
    with pytest.raises(ValueError, match="no corpus folder"):
        check_config(SeedsConfig(tmp_path, splits=["emodb-loso"], arms=["fedavg"], data_dir=tmp_path))


def test_command_line_parses_comma_lists():
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(["seeds", "--splits", "fsdd-within", "--arms", "fedavg,fedprox", "--folds", "2"])
    assert (args.splits, args.arms, args.folds, args.seeds, args.rounds) == (
        ["fsdd-within"],
        ["fedavg", "fedprox"],
        2,
        3,
        20,
    )
    assert args.run is bench_seeds.run_from_args


GROUPED_RUNS = [
    _run("fsdd-within", "grouped-1", seed, [0.5, 0.7, 0.9, 0.95 + 0.01 * seed], round_s=30.0)
    for seed in range(2)
] + [
    _run("fsdd-within", "grouped-2", 0, [0.6, 0.9, 0.95, 0.96], round_s=20.0),
    _run("fsdd-within", "grouped-2", 1, [0.6, 0.8, 0.92, 0.97], round_s=20.0),
    _run("fsdd-within", "grouped-N", 0, [0.4, 0.6, 0.8, 0.9], round_s=10.0),
    _run("fsdd-within", "grouped-N", 1, [0.4, 0.6, 0.8, 0.91], round_s=10.0),
]


def test_table2_puts_g_1_2_n_side_by_side_with_ratios_to_n():
    rows = summarize(GROUPED_RUNS, target=0.9, baseline="grouped-N")
    table = table2("fsdd-within", rows, 0.9)
    # G=1 reaches 0.9 in round 3 (90 s), G=2 in round 2 / 3 (40 s / 60 s), G=N in round 4 / 4 (40 s)
    assert (
        "| 1 | grouped-1 | 0.9550 ± 0.0071 | 3.0 (2/2) | 0.75x | 90.0 (2/2) | 2.25x | 120.0 | 3.00x |"
        in table
    )
    assert (
        "| 2 | grouped-2 | 0.9650 ± 0.0071 | 2.5 (2/2) | 0.62x | 50.0 (2/2) | 1.25x | 80.0 | 2.00x |" in table
    )
    assert (
        "| N | grouped-N | 0.9050 ± 0.0071 | 4.0 (2/2) | 1.00x | 40.0 (2/2) | 1.00x | 40.0 | 1.00x |" in table
    )
    assert table2("fsdd-within", summarize(GROUPED_RUNS[:2], 0.9, "fedavg"), 0.9).count("| 1 |") == 1
    assert table2("fsdd-within", [], 0.9) == ""


LOSO_RUNS = [
    _run(f"emodb-loso-{speaker}", arm, seed, [0.3, acc + 0.01 * seed])
    for speaker, base in (("03", 0.40), ("08", 0.50))
    for arm, acc in (("fedavg", base), ("mkd", base + 0.1))
    for seed in range(3)
]


def test_loso_table_per_speaker_mean_and_p_on_per_seed_means():
    table = loso_table(LOSO_RUNS)
    assert "| held-out speaker | fedavg | mkd |" in table
    assert "| 03 | 0.4100 | 0.5100 |" in table  # mean over seeds 0.40, 0.41, 0.42
    assert "| 08 | 0.5100 | 0.6100 |" in table
    assert "| mean (± SD over seeds, seeds) | 0.4600 ± 0.0100 (3) | 0.5600 ± 0.0100 (3) |" in table
    p = stats.ttest_ind([0.55, 0.56, 0.57], [0.45, 0.46, 0.47], equal_var=False).pvalue
    assert f"| p vs fedavg | nan | {p:.3f} |" in table
    assert "| d vs fedavg | nan | 10.00 |" in table
    goal = loso_goal(LOSO_RUNS)
    assert "mkd (+10.0 points" in goal
    # a seed missing one fold is left out of the per-seed means
    assert "(2)" in loso_table(LOSO_RUNS[1:])


def test_skewed_goal_uses_the_seed_mean_curve():
    runs = [
        _run("speech-commands-skewed", "fedavg", 0, [0.5, 0.85, 0.9]),
        _run("speech-commands-skewed", "fedavg", 1, [0.5, 0.79, 0.9]),
    ]
    goal = skewed_goal(runs, [0.84, 0.84])  # threshold 0.82: the mean curve gets there in round 2
    assert "| fedavg | 0.9000 | 2 | 2/2 | yes |" in goal


def test_launch_gives_a_folder_device_its_data(monkeypatch, tmp_path):
    from fedspeech_bench.fleets import launch

    started = []
    monkeypatch.setattr(launch, "start_device", lambda spec, args, *a, **k: started.append(args))
    specs = [DeviceSpec("folder", "", 0.25, data=tmp_path), DeviceSpec("speaker", "jackson", 0.25)]
    launch.launch_fleet(specs, "http://c", "mqtt://b", "fsdd", tmp_path / "corpora", tmp_path)
    assert started[0][:4] == ["--data", str(tmp_path), "--device-id", "folder"]
    assert "--corpus" not in started[0] and "--data-dir" not in started[0]
    assert started[1][:6] == ["--corpus", "fsdd", "--speaker", "jackson", "--device-id", "speaker"]


def test_fedbn_is_scored_by_its_personalised_models_next_to_its_global_one():
    run = _run("fsdd-within", "fedbn", 0, [0.2, 0.3])
    run.rounds[-1] = replace(run.rounds[-1], federated_accuracy=0.9)
    assert run.accuracies == [0.2, 0.9], "the devices' own scores where they evaluated"
    line = personalised_line([run, _run("fsdd-within", "fedavg", 0, [0.5])])
    assert "personalised models (their own normalisation layers) 0.9000" in line
    assert "global model (the initial normalisation layers) 0.3000" in line
    assert personalised_line([_run("fsdd-within", "fedavg", 0, [0.5])]) == ""
