"""The harness of the benchmarks that train for real: arms run on an emulated fleet, seed by seed.

`fedspeech bench strategies`, `growing` and `poisoning` are configurations of it (bench_config.BenchConfig):
each compares arms (coordinator settings: a strategy, a model and its depth schedule, attackers) on the
same emulated fleet, data split and seeds, and reports them against a baseline arm. `bench seeds` runs each
of its arms through run_once as well. An arm's settings, and a corpus', name fields of the coordinator's
typed config (fedspeech.coordinator.config), which they vary with CoordinatorConfig.changed.
"""

import logging
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedspeech.coordinator.config import CoordinatorConfig
from fedspeech.coordinator.strategies import STRATEGIES, strategy_class, strategy_params
from fedspeech.coordinator.strategies.params import split_option
from fedspeech_bench.bench_config import Arm, BenchConfig
from fedspeech_bench.fleet_run import attacking_devices, fleet_config, fleet_run
from fedspeech_bench.fleets.fleet_files import FLEETS_DIR, DeviceSpec, check_fleet, hosted_fleet, load_fleet
from fedspeech_bench.report.results import write_results
from fedspeech_bench.run_progress import Progress
from fedspeech_bench.runs import Run

log = logging.getLogger(__name__)


def strategy_arms(names: Sequence[str], k: int, float16: Sequence[str] = ()) -> list[Arm]:
    """An arm per strategy (k devices aggregated where it selects), then one per float16 strategy."""
    arms = [Arm(name, {"strategy": name, "k": k}) for name in names]
    half = [Arm(f"{name}_float16", {"strategy": name, "k": k, "precision": "float16"}) for name in float16]
    return arms + half


# the dynamic transformer: full depth from round 1 against growing a block per stage, with and without
# run-time weight scaling, and the growing one without each of its stabilisers
GROWING_ARMS = [
    Arm("fixed", {"model": "transformer", "depth_schedule": "constant"}),
    Arm("fixed_unscaled", {"model": "transformer_unscaled", "depth_schedule": "constant"}),
    Arm("growing", {"model": "transformer", "depth_schedule": "linear"}),
    Arm("growing_post_ln", {"model": "transformer_post_ln", "depth_schedule": "linear"}),
    Arm("growing_unscaled", {"model": "transformer_unscaled", "depth_schedule": "linear"}),
    # ours: unscaled, each new block started from the trained block below it
    Arm(
        "growing_copied",
        {"model": "transformer_unscaled", "depth_schedule": "linear", "new_blocks": "copied"},
    ),
]


# one of six FSDD devices sends its update's change x100, another its change reversed
POISONING_ATTACKS = {"george": "scale", "lucas": "sign_flip"}
# a strategy with settings is NAME:SETTING=VALUE[,SETTING=VALUE]; krum:m=0 is Multi-Krum (n - f averaged)
ROBUST_STRATEGIES = (
    "fedavg",
    "norm_bounded",
    "median",
    "trimmed_mean",
    "norm_bounded_trimmed_mean",
    "krum",
    "krum:m=0",
)


def strategies_config(
    out: Path, strategies: Sequence[str] | None = None, k: int = 3, float16: Sequence[str] = (), **kw: Any
) -> BenchConfig:
    """`bench strategies`: the strategies named (default all it can serve), and those in float16, vs FedAvg.

    Without names, a strategy whose needs this benchmark cannot meet is skipped with a line that says
    why; a named one is refused (ValueError) before anything runs.
    """
    names = list(strategies or STRATEGIES)
    unknown = sorted((set(names) | set(float16)) - set(STRATEGIES))
    if unknown:
        raise ValueError(f"unknown strategies {unknown}, expected some of {', '.join(STRATEGIES)}")
    config = BenchConfig(out, [], "fedavg", "fedspeech strategy benchmark", **kw)
    reasons = {name: why for name in {*names, *float16} if (why := unservable(name, config))}
    refused = [f"{name} {reasons[name]}" for name in [*(strategies or ()), *float16] if name in reasons]
    if refused:
        raise ValueError("; ".join(refused))
    for name in sorted(reasons):
        log.warning("bench strategies skips %s: it %s", name, reasons[name])
    return replace(config, arms=strategy_arms([n for n in names if n not in reasons], k, float16))


def unservable(name: str, config: BenchConfig) -> str | None:
    """What a strategy needs that the benchmark's corpora, models and fleets lack; None if nothing."""
    from fedspeech.coordinator.strategies import make_strategy

    needs = make_strategy(name, 1, 1).needs
    if needs.validation:
        return "needs a validation set on the coordinator, which this benchmark lacks (bench seeds runs it)"
    if needs.server_data:
        return "needs clips of the coordinator's own, which this benchmark lacks (bench seeds runs it)"
    for corpus in config.corpora:
        if needs.batch_norm and not _has_batch_norm(config.corpus_name(corpus)):
            return f"needs a model with batch normalisation, and {corpus}'s default model has none"
        devices = sum(len(spec.device_ids) for spec in config.fleet(corpus))
        if needs.min_devices > devices:
            return f"needs {needs.min_devices} results a round, and the {corpus} fleet has {devices} devices"
    return None


def _has_batch_norm(corpus: str) -> bool:
    """Whether the default model of a corpus' built-in task has batch normalisation."""
    from fedspeech.models import build_model
    from fedspeech.models.clips.tasks import BUILTIN_TASKS, spec_for
    from fedspeech.models.norm import norm_names

    return bool(norm_names(build_model(spec_for(BUILTIN_TASKS[corpus]))))


def growing_config(out: Path, data_dir: Path | None = None, hosts: int = 6, **kw: Any) -> BenchConfig:
    """`bench growing`: fixed-depth against growing transformers, FSDD on pi4-wifi and Speech Commands.

    Speech Commands has a device per speaker with training clips (over 200), hosted `hosts` to a
    process at a Pi 4's 0.25 core each; every round samples 30 of them at random, as the dynamic
    transformer's paper does.
    """
    from fedspeech.models.clips.datasets import client_clips, load_corpus, speakers

    fleets = {"fsdd": load_fleet(FLEETS_DIR / "pi4-wifi.toml")}
    if data_dir is not None:
        corpus = load_corpus("speech_commands", data_dir)
        trainers = [s for s in speakers(corpus) if client_clips(corpus, s)[0]]
        fleets["speech_commands"] = hosted_fleet(trainers, hosts, cpu_share=0.25)
    return BenchConfig(
        out,
        GROWING_ARMS,
        "fixed",
        "fedspeech growing-transformer benchmark",
        corpora=list(fleets),
        data_dir=data_dir,
        fleets=fleets,
        corpus_settings={"speech_commands": {"strategy": "random_k", "k": 30}},
        **kw,
    )


def strategy_settings(text: str) -> dict[str, Any]:
    """An arm's settings from NAME or NAME:SETTING=VALUE[,...]; ValueError with one line for a bad one."""
    name, _, rest = text.partition(":")
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}, expected one of {', '.join(STRATEGIES)}")
    options = dict(split_option(part) for part in rest.split(",")) if rest else {}
    return {"strategy": name, "strategy_settings": strategy_params(name, options)}


def poisoning_config(out: Path, strategies: Sequence[str] = ROBUST_STRATEGIES, **kw: Any) -> BenchConfig:
    """`bench poisoning`: FedAvg on an honest fleet, against each strategy with two attacking devices.

    FSDD on the pi4-wifi fleet (six devices, one per speaker); in the attacked arms two of its speakers'
    devices are replaced by attackers (POISONING_ATTACKS), which train on the same clips. The
    honest-only arm leaves those two out: the best a defence that ignores them can do; the unbounded
    arm is FedAvg without the default norm bound.
    """
    arms = [
        Arm("clean-fedavg", {"strategy": "fedavg"}),
        Arm("honest-only-fedavg", {"strategy": "fedavg"}, left_out=list(POISONING_ATTACKS)),
    ]
    arms += [Arm(f"attacked-{text}", strategy_settings(text), POISONING_ATTACKS) for text in strategies]
    # FedAvg as it was before every update's change was norm-bounded by default
    arms.append(
        Arm("attacked-fedavg-unbounded", {"strategy": "fedavg", "norm_bound": "off"}, POISONING_ATTACKS)
    )
    fleets = {"fsdd": load_fleet(FLEETS_DIR / "pi4-wifi.toml")}
    title = "fedspeech poisoning benchmark"
    return BenchConfig(out, arms, "clean-fedavg", title, corpora=["fsdd"], fleets=fleets, **kw)


def run_once(
    cfg: BenchConfig, corpus: str, arm: Arm, seed: int, on_round: Callable[[int], None] = lambda n: None
) -> Run:
    """Train one arm once on the corpus' fleet, with an embedded broker and throttled devices.

    on_round is called with each round's number as it completes (0: the initial model).
    """
    run_dir = cfg.out / "runs" / f"{corpus}-{arm.name}-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    fleet = _arm_fleet(cfg, corpus, arm)
    name = cfg.corpus_name(corpus)
    base = fleet_config(fleet, name, run_dir, data_dir=cfg.data_dir).changed(
        rounds=arm_rounds(cfg, corpus, arm), round_timeout=cfg.round_timeout_s, min_results=1, seed=seed
    )
    config = arm_config(cfg, corpus, arm, base)
    # The corpus' held-out set is the union of the devices' test splits: asking the devices as well
    # would add their evaluation time to every arm and tell nothing new, except where each device runs
    # a model of its own (FedBN, SiloBN), which only it can score.
    config = config.changed(
        eval_every=int(bool(strategy_class(config.rounds.strategy).personal)),
        min_devices=sum(len(spec.device_ids) for spec in fleet) + len(arm.attacks),
    )
    with (
        fleet_run(fleet, name, run_dir, config) as run,
        attacking_devices(arm.attacks, run, name, run_dir, cfg.data_dir),
    ):
        run.wait(cfg.round_timeout_s + 60, lambda record: on_round(record.round))
    rounds = run.service.store.rounds()[1:]
    # Timed from the first round: device start-up (imports, loading data) is the same for every arm.
    return Run(corpus, arm.name, seed, rounds, rounds[0].started_at)


def arm_config(
    cfg: BenchConfig, corpus: str, arm: Arm, base: CoordinatorConfig | None = None
) -> CoordinatorConfig:
    """An arm's coordinator config on a corpus: base (default: defaults), the corpus' settings, the arm's."""
    config = (base or CoordinatorConfig()).changed(**cfg.corpus_settings.get(corpus, {}))
    return config.changed(**arm.settings)


def _arm_fleet(cfg: BenchConfig, corpus: str, arm: Arm) -> list[DeviceSpec]:
    """The corpus' fleet without the arm's left-out speakers and those its attackers stand in for."""
    return [s for s in cfg.fleet(corpus) if s.speaker not in arm.attacks and s.speaker not in arm.left_out]


def arm_rounds(cfg: BenchConfig, corpus: str, arm: Arm) -> int:
    """The rounds an arm runs: cfg.rounds, or for a buffered strategy as many as aggregate as many results.

    A buffered strategy's round aggregates about K results where the others' aggregate one per device,
    so it runs rounds x devices / K rounds.
    """
    rounds = arm_config(cfg, corpus, arm).rounds
    if strategy_class(rounds.strategy).mode != "buffered":
        return cfg.rounds
    devices = sum(len(spec.device_ids) for spec in _arm_fleet(cfg, corpus, arm)) + len(arm.attacks)
    return math.ceil(cfg.rounds * devices / min(rounds.k, devices))


def run_all(cfg: BenchConfig) -> dict[str, list[Run]]:
    """Every arm and seed on every corpus, with a progress line and a result line per run."""
    by_corpus: dict[str, list[Run]] = {corpus: [] for corpus in cfg.corpora}
    with Progress(len(cfg.corpora) * cfg.seeds * len(cfg.arms), cfg.rounds) as progress:
        for corpus in cfg.corpora:
            for seed in range(cfg.seeds):
                for arm in cfg.arms:
                    progress.start_run(f"{corpus} {arm.name} seed {seed}", arm_rounds(cfg, corpus, arm))
                    run = run_once(cfg, corpus, arm, seed, progress.round_done)
                    progress.end_run()
                    by_corpus[corpus].append(run)
                    progress.say(
                        f"{corpus} {arm.name:16s} seed {seed}: accuracy {run.final_accuracy:.4f}, "
                        f"{run.wall_s:.1f} s, {run.bytes_total / 1e6:.1f} MB"
                    )
    return by_corpus


def run_bench(cfg: BenchConfig) -> Path:
    """Run every arm and seed on every corpus; write results.md, results.json and plots."""
    for corpus in cfg.corpora:  # timings only mean something if devices never slow each other down
        check_fleet(cfg.fleet(corpus))
    cfg.out.mkdir(parents=True, exist_ok=True)
    return write_results(cfg, run_all(cfg))
