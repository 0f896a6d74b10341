"""`fedspeech bench ...` and `fedspeech demo`: their options, and their checks before they start.

fedspeech finds these parsers by this distribution's entry points (fedspeech.commands); the benchmarks'
heavy imports wait inside the functions that run them.
"""

import argparse
from pathlib import Path

from fedspeech.connection_options import (
    at_least,
    cannot_serve,
    check_free,
    listen_port,
    results_folder,
    unreachable,
)
from fedspeech.defence_options import add_defence_options, defence_options
from fedspeech.privacy_options import add_dp_options, dp_options
from fedspeech.protocol.topics import parse_broker_url
from fedspeech_bench.attacks.insider_rounds import add_parser as add_insiders_parser
from fedspeech_bench.coldstart import add_parser as add_coldstart_parser
from fedspeech_bench.dashboard_polling import add_parser as add_dashboard_bench_parser
from fedspeech_bench.demo_defaults import DEMO_EPOCHS, DEMO_FLEET, DEMO_MODEL, DEMO_OUT, DEMO_ROUNDS
from fedspeech_bench.detection_latency import add_parser as add_latency_parser
from fedspeech_bench.fleets.fleet_files import fleet_path, shipped_fleets
from fedspeech_bench.privacy import add_parser as add_privacy_parser
from fedspeech_bench.seeds import add_parser as add_seeds_parser

BENCH_HELP = "benchmarks"
DEMO_HELP = "one coordinator and one device per FSDD speaker, end to end"
STRATEGY_HELP = "a strategy's name (`fedspeech strategies` lists them)"


def _bench_strategies(args: argparse.Namespace) -> None:
    from fedspeech_bench.harness import run_bench, strategies_config

    corpora = args.corpus or (["fsdd", "emodb"] if args.data_dir else ["fsdd"])
    for corpus in corpora:
        check_corpus("bench strategies", corpus, args.data_dir)
    results_folder("bench strategies", args.out)
    server = {"server_momentum": args.server_momentum, "final_lr_fraction": args.final_lr_fraction}
    every_arm = {name: value for name, value in server.items() if value is not None}
    try:
        every_arm |= defence_options(args)
        config = strategies_config(
            args.out, args.strategy, args.k, args.float16 or (), corpora=corpora, seeds=args.seeds,
            rounds=args.rounds, data_dir=args.data_dir, corpus_settings=dict.fromkeys(corpora, every_arm),
        )  # fmt: skip
    except ValueError as exc:
        raise SystemExit(f"fedspeech bench strategies: {exc}") from None
    run_bench(config)


def _bench_growing(args: argparse.Namespace) -> None:
    from dataclasses import replace

    from fedspeech_bench.bench_config import DEFAULT_TARGETS
    from fedspeech_bench.harness import GROWING_ARMS, growing_config, run_bench

    names = [arm.name for arm in GROWING_ARMS]
    unknown = sorted(set(args.arm or ()) - set(names))
    if unknown:
        raise SystemExit(f"fedspeech bench growing: no arm {', '.join(unknown)}; arms: {', '.join(names)}")
    corpora = args.corpus or (["fsdd", "speech_commands"] if args.data_dir else ["fsdd"])
    for corpus in corpora:  # speech_commands is not bundled: without --data-dir this says so
        check_corpus("bench growing", corpus, args.data_dir)
    results_folder("bench growing", args.out)
    cfg = growing_config(args.out, args.data_dir, seeds=args.seeds, rounds=args.rounds)
    targets = dict(DEFAULT_TARGETS) | dict(args.target or [])
    arms = [arm for arm in cfg.arms if not args.arm or arm.name in args.arm]
    baseline = cfg.baseline if cfg.baseline in {arm.name for arm in arms} else arms[0].name
    cfg = replace(cfg, corpora=args.corpus or cfg.corpora, targets=targets, arms=arms, baseline=baseline)
    run_bench(cfg)


def _target(text: str) -> tuple[str, float]:
    """argparse type: CORPUS=ACCURACY, the accuracy a fraction between 0 and 1."""
    corpus, _, accuracy = text.partition("=")
    try:
        value = float(accuracy)
    except ValueError:
        value = -1.0
    if not corpus or not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give CORPUS=ACCURACY, e.g. fsdd=0.9")
    return corpus, value


def _bench_poisoning(args: argparse.Namespace) -> None:
    from fedspeech_bench.harness import ROBUST_STRATEGIES, poisoning_config, run_bench

    results_folder("bench poisoning", args.out)
    try:
        config = poisoning_config(
            args.out, args.strategy or ROBUST_STRATEGIES, seeds=args.seeds, rounds=args.rounds
        )
    except ValueError as exc:
        raise SystemExit(f"fedspeech bench poisoning: {exc}") from None
    run_bench(config)


def _bench_attacks(args: argparse.Namespace) -> None:
    from fedspeech_bench.attacks.bench import run_attacks
    from fedspeech_bench.attacks.catalogue import ATTACKS
    from fedspeech_bench.attacks.live_fleet import FleetSettings

    unknown = sorted(set(args.attack or ()) - set(ATTACKS))
    if unknown:
        raise SystemExit(
            f"fedspeech bench attacks: no attack {', '.join(unknown)}; attacks: {', '.join(ATTACKS)}"
        )
    if args.attack_from > args.rounds:
        raise SystemExit(f"fedspeech bench attacks: --attack-from {args.attack_from} is after the last round")
    results_folder("bench attacks", args.out)
    settings = FleetSettings(rounds=args.rounds, epochs=args.epochs, attack_from=args.attack_from)
    run_attacks(args.out, args.attack or list(ATTACKS), settings)


def _bench_central(args: argparse.Namespace) -> None:
    from fedspeech_bench.central import run_central

    check_corpus("bench central", args.corpus, args.data_dir, args.leave_out)
    results_folder("bench central", args.out)
    run_central(args.corpus, args.out, args.seeds, args.epochs, args.data_dir, args.leave_out)


def _bench_inference(args: argparse.Namespace) -> None:
    from fedspeech_bench.inference import BenchError, run_inference_bench

    if not args.model.is_file():
        raise SystemExit(
            f"fedspeech bench inference: no model at {args.model}: run `fedspeech demo` first or pass --model"
        )
    results_folder("bench inference", args.out)
    try:
        run_inference_bench(args.model, args.out, args.data_dir, args.repeats)
    except BenchError as exc:
        raise SystemExit(f"fedspeech bench inference: {exc}") from None


def check_corpus(command: str, corpus: str, data_dir: Path | None, speaker: str | None = None) -> None:
    """SystemExit with one line unless the corpus is there to be listed (and has the speaker named)."""
    from fedspeech.models.clips.datasets import load_corpus, speakers

    try:
        data = load_corpus(corpus, data_dir)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"fedspeech {command}: {exc}") from None
    if speaker is not None and speaker not in speakers(data):
        raise SystemExit(
            f"fedspeech {command}: {corpus} has no speaker {speaker!r}; it has {', '.join(speakers(data))}"
        )


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench` and its benchmarks to the command line."""
    b = subparsers.add_parser("bench", help=BENCH_HELP).add_subparsers(dest="bench", required=True)
    bs = b.add_parser("strategies", help="every strategy on the same emulated Pi fleet, data and seeds")
    bs.add_argument("--out", type=Path, default=Path("fedspeech-bench"), help="where results go")
    bs.add_argument("--corpus", action="append", choices=["fsdd", "emodb"], help="repeatable")
    bs.add_argument("--data-dir", type=Path, help="folder holding the corpora (needed for emodb)")
    bs.add_argument("--strategy", action="append", help=f"{STRATEGY_HELP}; repeatable (default all)")
    bs.add_argument("--seeds", type=at_least(1), default=3)
    bs.add_argument("--rounds", type=at_least(1), default=20)
    bs.add_argument(
        "--k",
        type=at_least(1),
        default=3,
        help="devices aggregated per round by top-K strategies; the results a fedbuff round closes on",
    )
    bs.add_argument(
        "--float16",
        action="append",
        metavar="STRATEGY",
        help="also run STRATEGY with weights sent in float16 both ways, as arm STRATEGY_float16; repeatable",
    )
    bs.add_argument("--server-momentum", type=float, help="for every arm (default 0)")
    bs.add_argument("--final-lr-fraction", type=float, help="for every arm (default 1)")
    add_defence_options(bs)  # for every arm: with --norm-bound off --no-direction-check, what they cost
    bs.set_defaults(run=_bench_strategies)
    bg = b.add_parser("growing", help="fixed-depth against growing transformers, and the growth ablations")
    bg.add_argument("--out", type=Path, default=Path("fedspeech-bench-growing"), help="where results go")
    bg.add_argument("--corpus", action="append", choices=["fsdd", "speech_commands"], help="repeatable")
    bg.add_argument("--data-dir", type=Path, help="folder holding the corpora (needed for speech_commands)")
    bg.add_argument(
        "--arm", action="append", help="only this arm (default all; the first is the baseline without fixed)"
    )
    bg.add_argument("--seeds", type=at_least(1), default=3)
    bg.add_argument("--rounds", type=at_least(1), default=20)
    bg.add_argument(
        "--target", action="append", type=_target, help="CORPUS=ACCURACY for time to target, repeatable"
    )
    bg.set_defaults(run=_bench_growing)
    bp = b.add_parser(
        "poisoning", help="robust aggregation against two of six devices sending poisoned updates"
    )
    bp.add_argument("--out", type=Path, default=Path("fedspeech-bench-poisoning"), help="where results go")
    bp.add_argument(
        "--strategy",
        action="append",
        metavar="NAME[:SETTING=VALUE,...]",
        help="repeatable, e.g. krum:m=0 for Multi-Krum; default: fedavg and the robust ones",
    )
    bp.add_argument("--seeds", type=at_least(1), default=3)
    bp.add_argument("--rounds", type=at_least(1), default=20)
    bp.set_defaults(run=_bench_poisoning)
    ba = b.add_parser(
        "attacks", help="each attack on a live deployment of real processes, against a clean run"
    )
    ba.add_argument("--out", type=Path, default=Path("fedspeech-bench-attacks"), help="where results go")
    ba.add_argument("--attack", action="append", help="only this attack (repeatable; default all)")
    ba.add_argument("--rounds", type=at_least(2), default=8, help="rounds of each arm (default 8)")
    ba.add_argument("--epochs", type=at_least(1), default=2, help="local epochs a round (default 2)")
    ba.add_argument(
        "--attack-from", type=at_least(1), default=1,
        help="the first round the compromised device attacks in, honest before (default 1)",
    )  # fmt: skip
    ba.set_defaults(run=_bench_attacks)
    bc = b.add_parser("central", help="the same model trained on all training clips in one place")
    bc.add_argument("--corpus", choices=["fsdd", "emodb", "speech_commands"], default="fsdd")
    bc.add_argument("--out", type=Path, default=Path("fedspeech-bench-central"), help="where results go")
    bc.add_argument("--data-dir", type=Path, help="folder holding the corpora (default: bundled data/)")
    bc.add_argument("--seeds", type=at_least(1), default=3)
    bc.add_argument("--epochs", type=at_least(1), default=40, help="passes over the data (default 40)")
    bc.add_argument(
        "--leave-out", metavar="SPEAKER", help="train on the other speakers, score on all of this one's clips"
    )
    bc.set_defaults(run=_bench_central)
    bi = b.add_parser("inference", help="per-window latency, floor, and `listen` CPU, memory and cold start")
    bi.add_argument("--model", type=Path, default=DEMO_MODEL, help="an exported model")
    bi.add_argument("--out", type=Path, default=Path("fedspeech-bench-inference"), help="where results go")
    bi.add_argument("--data-dir", type=Path, help="folder holding its corpus (default: bundled data/)")
    bi.add_argument("--repeats", type=at_least(1), default=1000, help="windows timed per engine")
    bi.set_defaults(run=_bench_inference)
    add_seeds_parser(b)
    _add_listen_bench_parser(b)
    add_dashboard_bench_parser(b)
    add_privacy_parser(b)
    add_latency_parser(b)
    add_coldstart_parser(b)
    add_insiders_parser(b)


def _bench_listen(args: argparse.Namespace) -> None:
    from fedspeech_bench.listen_bench import run_from_args

    run_from_args(args)


def _add_listen_bench_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `bench listen` and its options to the `bench` subcommands."""
    p = bench_subparsers.add_parser(
        "listen", help="`fedspeech listen` on held-out speakers' words, clean, in noise and on noise alone"
    )
    p.add_argument(
        "--model",
        action="append",
        metavar="[NAME=]PATH",
        help=f"an exported model; repeatable (default {DEMO_MODEL}, named by its file stem)",
    )
    p.add_argument(
        "--data-dir", type=Path, help="holds speech_commands_test/ for real noise (default: skip it)"
    )
    p.add_argument("--out", type=Path, default=Path("fedspeech-bench-listen"), help="where results go")
    p.add_argument("--seed", type=int, default=0, help="word order and noise (default 0)")
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="hear every model with this many seeds from --seed on; with several runs, a table of the mean "
        "and spread over all of them (default 1)",
    )
    p.add_argument("--pause-s", type=float, default=0.6, help="silence around each word (default 0.6)")
    p.add_argument("--noise-minutes", type=float, default=5.0, help="of each noise alone (default 5)")
    p.add_argument(
        "--talk-minutes", type=float, default=30.0, help="of talk without a task word (default 30, 0: none)"
    )
    p.add_argument("--threshold", type=float, help="override the listener's detection threshold")
    p.add_argument(
        "--no-vad", action="store_true", help="the listener's energy gate alone, no voice detector"
    )
    p.add_argument(
        "--words", type=int, help="only the first N words of the shuffled stream (default all 300)"
    )
    p.add_argument("--keep-audio", action="store_true", help="keep the streams' WAV files under OUT/audio")
    p.set_defaults(run=_bench_listen)


def _demo(args: argparse.Namespace) -> None:
    from fedspeech.coordinator.config import RoundConfig
    from fedspeech.coordinator.strategies import STRATEGIES
    from fedspeech_bench.demo import FULL_SPEED_STRATEGY, DemoConfig, run_demo

    if args.strategy is not None and args.strategy not in STRATEGIES:
        known = ", ".join(STRATEGIES)
        raise SystemExit(f"fedspeech demo: unknown strategy {args.strategy!r}, expected one of {known}")
    dp = dp_options(args)
    strategy = args.strategy or (FULL_SPEED_STRATEGY if args.full_speed else DemoConfig.strategy)
    try:
        defence = defence_options(args)
        RoundConfig(rounds=args.rounds, strategy=strategy, **dp, **defence)
    except ValueError as exc:
        raise SystemExit(f"fedspeech demo: {exc}") from None
    fleet = None if args.fleet is None else fleet_path(args.fleet)
    if fleet is not None and not fleet.is_file():
        raise SystemExit(
            f"fedspeech demo: --fleet {args.fleet}: no such file, nor a fleet of fedspeech-bench's "
            f"({', '.join(shipped_fleets())})"
        )
    if args.port != 0:
        try:
            check_free("127.0.0.1", args.port)
        except OSError as exc:
            raise SystemExit(f"fedspeech demo: {cannot_serve('127.0.0.1', args.port, exc)}") from None
    if args.broker is not None:
        _check_broker("demo", args.broker)
    results_folder("demo", args.out)

    run_demo(
        DemoConfig(
            out=args.out,
            fleet=None if args.full_speed else fleet or DemoConfig.fleet,
            strategy=strategy,
            privacy=dp,
            defences=defence,
            rounds=args.rounds,
            epochs=args.epochs,
            broker_url=args.broker,
            port=args.port,
            max_samples=args.max_samples,
            eval_every=args.eval_every if args.eval_every is not None else DemoConfig.eval_every,
            secure_aggregation=args.secure_aggregation,
            synthetic=args.synthetic,
            seed=args.seed,
        )
    )


def _check_broker(command: str, url: str) -> None:
    """SystemExit with one line if the broker URL is not one, or nothing answers there."""
    try:
        why = unreachable(*parse_broker_url(url))
    except ValueError as exc:
        raise SystemExit(f"fedspeech {command}: {exc}") from None
    if why is not None:
        raise SystemExit(
            f"fedspeech {command}: nothing answers at {url} ({why}): start that broker, or leave out --broker"
        )


def add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `demo` and its options to the command line."""
    m = subparsers.add_parser("demo", help=DEMO_HELP)
    m.add_argument("--out", type=Path, default=DEMO_OUT, help="where results go")
    m.add_argument(
        "--fleet",
        help=f"emulated fleet: a file, or one of {', '.join(shipped_fleets())} (default {DEMO_FLEET}; "
        "pi-mix has two Pi 3s, whose pace every round waits for)",
    )
    m.add_argument("--full-speed", action="store_true", help="one unthrottled device per speaker instead")
    m.add_argument(
        "--synthetic",
        action="store_true",
        help="start from a model of the digits and other words spoken by this machine's synthesizers, and "
        "mix such takes into each device's training, so that the none class hears speech that is no digit "
        "(needs espeak-ng; minutes more)",
    )
    m.add_argument(
        "--secure-aggregation",
        action="store_true",
        help="the coordinator learns only the sum of each round's updates, never one device's",
    )
    m.add_argument("--strategy", help=f"{STRATEGY_HELP} (default epochs_only; fedavg with --full-speed)")
    m.add_argument("--rounds", type=at_least(1), default=DEMO_ROUNDS, help=f"(default {DEMO_ROUNDS})")
    m.add_argument(
        "--epochs",
        type=at_least(1),
        default=DEMO_EPOCHS,
        help=f"local epochs per round of the fastest devices (default {DEMO_EPOCHS})",
    )
    m.add_argument("--broker", help="mqtt:// or mqtts:// (TLS) URL of an existing broker (default: embedded)")
    m.add_argument("--port", type=listen_port, default=0, help="coordinator HTTP port (default: a free one)")
    m.add_argument("--max-samples", type=at_least(1), help="train on at most this many clips per device")
    m.add_argument(
        "--eval-every", type=at_least(0), help="devices evaluate every N rounds' model (default 5)"
    )
    m.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the first model's weights and each device's draws of its clips (default 0)",
    )
    add_dp_options(m)
    add_defence_options(m)
    m.set_defaults(run=_demo)
