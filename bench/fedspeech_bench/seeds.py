"""`fedspeech bench seeds`: the seed papers' methods against FedAvg on the same splits, fleets and seeds.

Splits, each a corpus, a fleet and how the coordinator scores the global model (fedspeech_bench.splits
holds the rules that make them):
- fsdd-within: FSDD on pi-mix.toml (a device per speaker), scored on the union of the speakers' test splits.
- emodb-within: EmoDB's 3 s task on pi-mix-10.toml (a device per speaker), scored likewise.
- emodb-loso: leave one speaker out (FedCSR, Table 5). For each speaker in sorted order (the first
  --folds of them), its device is left out of pi-mix-10.toml, the other nine train on their training
  splits and the coordinator scores every round's model on all of the held-out speaker's clips.
- speech-commands-skewed: the label-skewed fleet FedVMR's class-distribution regulariser is for
  (skewed_deal gives the rule): six Pi 4 class devices, each a folder of several speakers' clips, three
  of them lacking four labels each, scored on the clips of speakers no device holds.

Arms: FedAvg (the baseline), FedProx, FedBN against FedAvg on the same BatchNorm CNN, quality-weighted
aggregation, grouped sequential training with G = 1, 2 and N groups, the class-distribution regulariser
(FedVMR) and mutual knowledge distillation (FedCSR). Quality's validation set and MKD's server data are
the same small folder: the first VALIDATION_PER_LABEL training clips (in path order) of each training
device and label, the clips its owner would opt in to share; never a test clip, never a held-out
speaker's clip.

FedBN keeps normalisation layers on the devices, so within a speaker its meaningful score is each
device's personalised model on its own test split: in the within-speaker splits its arm is scored by
federated evaluation every round (the same clips as the others' central set, each scored by its own
device's model, and its wall time includes that evaluation). Where the test speakers have no device
(emodb-loso, speech-commands-skewed) it is scored centrally like the others, by its global model.

A run already finished under OUT (same split, arm, seed and number of rounds) is read back from
OUT/completed instead of trained again: delete OUT to start over.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from fedspeech_bench.bench_config import SEEDS_ARMS, Arm, BenchConfig, CentralResult, Results, SeedsConfig
from fedspeech_bench.report.results import write_seeds_results
from fedspeech_bench.report.tables import BASELINE
from fedspeech_bench.run_progress import Progress
from fedspeech_bench.splits import (
    SPLIT_CORPUS,
    SPLITS,
    Setting,
    SkewedDeal,
    folder_train_clips,
    label_counts_table,
    loso_settings,
    skewed_setting,
    within_setting,
)

if TYPE_CHECKING:  # the command line is built without the benchmark's heavy imports
    from fedspeech.protocol.messages import ModelSpec
    from fedspeech_bench.central import Waveforms
    from fedspeech_bench.runs import Run

# the shared folder quality and mkd also get, besides their settings in SEEDS_ARMS
ARM_FOLDERS = {"quality": "validation_data", "mkd": "server_data"}


def check_config(cfg: SeedsConfig) -> None:
    """ValueError, in one line, for anything that would only fail later: names, counts, data, strategies."""
    unknown = [s for s in cfg.splits if s not in SPLITS]
    if unknown:
        raise ValueError(f"unknown splits {unknown}, expected some of {', '.join(SPLITS)}")
    if not cfg.splits:
        raise ValueError("no splits to run")
    check_arms(cfg.arms)
    for name, value in (("seeds", cfg.seeds), ("rounds", cfg.rounds), ("folds", cfg.folds)):
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be at least 1, got {value}")
    check_data(cfg.splits, cfg.data_dir)


def check_data(splits: Sequence[str], data_dir: Path | None) -> None:
    """ValueError unless every split's corpus is in data_dir (FSDD: or bundled, when data_dir is None)."""
    from fedspeech.models.clips.datasets import CORPORA

    needs = sorted({SPLIT_CORPUS[s] for s in splits} - {"fsdd"})
    if needs and data_dir is None:
        raise ValueError(f"{', '.join(needs)} need --data-dir, the folder holding the corpora")
    if data_dir is not None:
        missing = [str(data_dir / CORPORA[c]) for c in sorted({SPLIT_CORPUS[s] for s in splits})]
        missing = [folder for folder in missing if not Path(folder).is_dir()]
        if missing:
            raise ValueError(f"no corpus folder {', '.join(missing)} (--data-dir holds one per corpus)")


def check_arms(names: Sequence[str]) -> None:
    """ValueError for an arm not in SEEDS_ARMS, or whose strategy or model this install does not have."""
    from fedspeech.coordinator.strategies import STRATEGIES
    from fedspeech.models.architectures import MODELS

    if not names:
        raise ValueError("no arms to run")
    unknown = [name for name in names if name not in SEEDS_ARMS]
    if unknown:
        raise ValueError(f"unknown arms {unknown}, expected some of {', '.join(SEEDS_ARMS)}")
    for name in names:
        strategy, model = SEEDS_ARMS[name]["strategy"], SEEDS_ARMS[name].get("model", "cnn")
        if strategy not in STRATEGIES:
            raise ValueError(
                f"arm {name!r} needs strategy {strategy!r}, which is not registered in "
                f"fedspeech.coordinator.strategies (known: {', '.join(STRATEGIES)})"
            )
        if model not in MODELS:
            raise ValueError(f"arm {name!r} needs model {model!r}, expected one of {', '.join(MODELS)}")


def arm_for(name: str, setting: Setting) -> Arm:
    """The Arm of an arm name on a setting: its settings, the shared folder, FedBN's evaluation."""
    from fedspeech.coordinator.strategies import strategy_params

    settings = dict(SEEDS_ARMS[name])
    if "strategy_settings" in settings:  # as text here: made the strategy's settings once
        settings["strategy_settings"] = strategy_params(settings["strategy"], settings["strategy_settings"])
    if name in ARM_FOLDERS:
        settings[ARM_FOLDERS[name]] = setting.validation
    if name == "fedbn" and setting.personalised:  # the devices score their own; the global model as well
        settings |= {"eval_every": 1}
    return Arm(name, settings)


# --- centralized reference -------------------------------------------------------------------------


def central_clips(deal: SkewedDeal) -> tuple[ModelSpec, Waveforms, Waveforms]:
    """The federated runs' CNN, every device's training clips pooled and the evaluation clips, loaded."""
    from fedspeech.models.clips.tasks import BUILTIN_TASKS, spec_for
    from fedspeech_bench.central import load_clips

    spec = spec_for(BUILTIN_TASKS["speech_commands"])
    train = [c for clips in deal.devices for c in folder_train_clips(clips, deal.labels)]
    return spec, load_clips(spec, train), load_clips(spec, deal.evaluation)


def central_reference(
    spec: ModelSpec, train: Waveforms, test: Waveforms, seed: int, epochs: int
) -> CentralResult:
    """Train the CNN on the pooled clips (central_clips); score it on the evaluation set.

    The same clips, model, batch size and learning rate as the federated arms; epochs should be their
    budget, rounds x local epochs.
    """
    from fedspeech_bench.central import train_central

    score = train_central(spec, train, test, seed, epochs)
    return CentralResult(seed, epochs, score.accuracy, score.seconds)


# --- running ---------------------------------------------------------------------------------------


def build_settings(cfg: SeedsConfig) -> tuple[dict[str, list[Setting]], SkewedDeal | None]:
    """Every split's settings (folds for LOSO), with their data folders written under OUT/data."""
    from fedspeech.models.clips.datasets import load_corpus
    from fedspeech_bench.fleets.fleet_files import DEFAULT_FLEETS, load_fleet

    settings: dict[str, list[Setting]] = {}
    deal = None
    for split in cfg.splits:
        corpus = load_corpus(SPLIT_CORPUS[split], cfg.data_dir)
        if split == "speech-commands-skewed":
            setting, deal = skewed_setting(corpus, cfg.out)
            settings[split] = [setting]
        elif split == "emodb-loso":
            settings[split] = loso_settings(corpus, load_fleet(DEFAULT_FLEETS["emodb"]), cfg.out, cfg.folds)
        else:
            settings[split] = [
                within_setting(split, corpus, load_fleet(DEFAULT_FLEETS[corpus.name]), cfg.out)
            ]
    return settings, deal


def _completed_path(cfg: SeedsConfig, setting: Setting, arm: str, seed: int) -> Path:
    return cfg.out / "completed" / f"{setting.key}-{arm}-{seed}.json"


def completed_run(cfg: SeedsConfig, setting: Setting, arm: str, seed: int) -> Run | None:
    """The run as OUT/completed holds it from an earlier bench with as many rounds, or None."""
    from fedspeech_bench.runs import Run

    done = _completed_path(cfg, setting, arm, seed)
    if not done.exists():
        return None
    run = Run.from_dict(json.loads(done.read_text()))
    return run if len(run.rounds) == cfg.rounds else None


def train_run(
    cfg: SeedsConfig, setting: Setting, arm: str, seed: int, on_round: Callable[[int], None] = lambda n: None
) -> Run:
    """Train one arm once on a setting and keep the run in OUT/completed; on_round as harness.run_once's."""
    from fedspeech_bench.harness import run_once

    bench = BenchConfig(
        cfg.out,
        [],
        BASELINE,
        seeds=cfg.seeds,
        rounds=cfg.rounds,
        data_dir=cfg.data_dir,
        fleets={setting.key: setting.fleet},
        corpus_settings={setting.key: setting.settings},
        corpus_of={setting.key: setting.corpus},
        round_timeout_s=cfg.round_timeout_s,
    )
    run = run_once(bench, setting.key, arm_for(arm, setting), seed, on_round)
    done = _completed_path(cfg, setting, arm, seed)
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps(asdict(run)))
    return run


def run_seeds(cfg: SeedsConfig) -> Path:
    """Run every split, fold, seed and arm; write results.md, results.json and plots under cfg.out."""
    from fedspeech_bench.fleets.fleet_files import check_fleet

    check_config(cfg)
    cfg = replace(cfg, out=cfg.out.resolve())  # the devices and coordinator read its folders by path
    cfg.out.mkdir(parents=True, exist_ok=True)
    settings, deal = build_settings(cfg)
    for group in settings.values():  # timings only mean something if devices never slow each other down
        for setting in group:
            check_fleet(setting.fleet)
    if deal is not None:
        print("speech-commands-skewed: clips per device and label\n" + label_counts_table(deal), flush=True)
    results = Results({split: [] for split in cfg.splits})
    runs = cfg.seeds * sum(len(settings[split]) for split in cfg.splits) * len(cfg.arms)
    with Progress(runs, cfg.rounds) as progress:
        for seed in range(cfg.seeds):
            for split in cfg.splits:
                for setting in settings[split]:
                    for arm in cfg.arms:
                        run = _run(cfg, setting, arm, seed, progress, results.failures)
                        if run is not None:
                            results.runs[split].append(run)
    if deal is not None and cfg.central:
        epochs = cfg.rounds * _local_epochs()
        central = central_clips(deal)  # loaded once for every seed
        with Progress(cfg.seeds) as progress:
            for seed in range(cfg.seeds):
                progress.start_run(f"centralized seed {seed}")
                results.central.append(central_reference(*central, seed, epochs))
                progress.end_run()
                progress.say(f"centralized seed {seed}: accuracy {results.central[-1].accuracy:.4f}")
    return write_seeds_results(cfg, settings, deal, results)


def _run(
    cfg: SeedsConfig, setting: Setting, arm: str, seed: int, progress: Progress, failures: list[str]
) -> Run | None:
    """One run, read back or trained, with its result line; None if it failed (added to failures)."""
    run = completed_run(cfg, setting, arm, seed)
    if run is not None:
        progress.skip_run()
    else:
        progress.start_run(f"{setting.key} {arm} seed {seed}")
        try:
            run = train_run(cfg, setting, arm, seed, progress.round_done)
        except Exception as exc:  # one broken run must not lose hours of the others
            progress.say(traceback.format_exc().rstrip(), file=sys.stderr)
            failures.append(f"{setting.key} {arm} seed {seed}: {exc}")
            return None
        finally:
            progress.end_run()
    progress.say(
        f"{setting.key} {arm:12s} seed {seed}: accuracy {run.final_accuracy:.4f}, "
        f"{run.wall_s:.1f} s ({run.wall_s / len(run.rounds):.1f} s a round), "
        f"{run.bytes_total / 1e6:.1f} MB"
    )
    return run


def _local_epochs() -> int:
    from fedspeech.coordinator.config import RoundConfig

    return RoundConfig().epochs


# --- command line ----------------------------------------------------------------------------------


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `bench seeds` and its options to the `bench` subcommands."""
    p = bench_subparsers.add_parser(
        "seeds",
        help="FedAvg, FedProx, FedBN, quality, grouped, class prior and MKD on the same splits and seeds",
    )
    p.add_argument(
        "--splits", type=_names, default=list(SPLITS), help=f"comma-separated (default: {','.join(SPLITS)})"
    )
    p.add_argument(
        "--arms",
        type=_names,
        default=list(SEEDS_ARMS),
        help=f"comma-separated (default: {','.join(SEEDS_ARMS)})",
    )
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument(
        "--folds", type=int, help="emodb-loso: only the first N speakers in sorted order (default all)"
    )
    p.add_argument(
        "--data-dir", type=Path, help="folder holding the corpora (needed for emodb, speech_commands)"
    )
    p.add_argument("--out", type=Path, default=Path("fedspeech-bench-seeds"), help="where results go")
    p.add_argument("--no-central", action="store_true", help="skip the skewed fleet's centralized reference")
    p.set_defaults(run=run_from_args)


def run_from_args(args: argparse.Namespace) -> None:
    """`fedspeech bench seeds`: check the options, then run."""
    cfg = SeedsConfig(
        out=args.out,
        splits=args.splits,
        arms=args.arms,
        seeds=args.seeds,
        rounds=args.rounds,
        folds=args.folds,
        data_dir=args.data_dir,
        central=not args.no_central,
    )
    try:
        check_config(cfg)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"fedspeech bench seeds: {exc}") from None
    run_seeds(cfg)
