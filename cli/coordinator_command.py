"""`fedspeech coordinator`: its options and how they become the service's settings."""

import argparse
import errno
import logging
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedspeech.connection_options import (
    add_broker_options,
    at_least,
    broker_settings,
    cannot_serve,
    check_free,
    listen_port,
    port,
    reason,
    seconds,
    warn_if_unreachable,
)
from fedspeech.models.architectures import MODELS, NEW_BLOCKS
from fedspeech.protocol.topics import DEFAULT_ROOT
from fedspeech.protocol.weights import PRECISIONS

# names are checked where the strategy is made, so that the device commands never load coordinator code
STRATEGY_NAMES = "a strategy's name (README: Strategies)"


def run(args: argparse.Namespace) -> None:
    """`fedspeech coordinator`: the service from its options, until SIGTERM or SIGINT."""
    from fedspeech.coordinator.app import create_app, serve
    from fedspeech.models.clips.tasks import TaskFileError

    if args.broker is not None:
        broker_settings(args, args.broker, "coordinator")  # one line for options that cannot work
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SystemExit("fedspeech coordinator: --tls-cert and --tls-key go together")
    _check_paths(args)
    config = {
        "STATE_DIR": args.state,
        "BROKER_URL": args.broker,
        "BROKER_USERNAME": args.broker_username or ("coordinator" if args.broker_password_file else None),
        "BROKER_PASSWORD_FILE": args.broker_password_file,
        "BROKER_CA": args.broker_ca,
        "BROKER_CERT": args.broker_cert,
        "BROKER_KEY": args.broker_key,
        "OPEN_ENROLMENT": args.open_enrolment or None,
        "TLS_CERT": args.tls_cert,
        "TLS_KEY": args.tls_key,
        "ADMIN_TOKEN_FILE": args.admin_token_file,
        "HTTP_TIMEOUT_S": args.http_timeout,
        "MAX_DEVICE_SAMPLES": args.max_device_samples,
        "MAX_DEVICES": args.max_devices,
        "EMBEDDED_BROKER_PORT": args.broker_port,
        "TOPIC_ROOT": args.topic_root,
        "TASK": args.task,
        "EVAL_DATA": args.eval_data,
        "EVAL_CORPUS": args.eval_corpus,
        "DATA_DIR": args.data_dir,
        "EVAL_LIMIT": args.eval_limit,
        "EVAL_EVERY": args.eval_every,
        "EVAL_DEVICES": args.eval_devices,
        "EVAL_TIMEOUT_S": args.eval_timeout,
        "ROUNDS": args.rounds,
        "MIN_DEVICES": args.min_devices,
        "MIN_RESULTS": args.min_results,
        "ROUND_TIMEOUT_S": args.round_timeout,
        "EPOCHS": args.epochs,
        "BATCH_SIZE": args.batch_size,
        "LEARNING_RATE": args.lr,
        "FINAL_LR_FRACTION": args.final_lr_fraction,
        "SERVER_MOMENTUM": args.server_momentum,
        "STRATEGY": args.strategy,
        "STRATEGY_OPTIONS": _strategy_options(args.strategy_opt),
        "K": args.k,
        "MODEL": args.model,
        "MODEL_DEPTH": args.depth,
        "DEPTH_SCHEDULE": args.depth_schedule,
        "DEPTH_STAGES": args.depth_stages,
        "NEW_BLOCKS": args.new_blocks,
        "PRECISION": args.precision,
        "VALIDATION_DATA": args.validation_data,
        "SERVER_DATA": args.server_data,
        "SHARED_VALIDATION": args.shared_validation,
    }
    options = {k: v for k, v in config.items() if v is not None}
    _check_before_start(_settings(options), args)  # one line before anything starts or logs
    try:
        app = create_app(options)
    except (TaskFileError, ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"fedspeech coordinator: {exc}") from None
    service = app.extensions["fedspeech"]
    try:
        service.start()
    except OSError as exc:  # the embedded broker's port, taken since it was checked
        if service.broker is None:
            raise
        raise SystemExit(_broker_port_message(service.broker.host, service.broker.port, exc)) from None
    try:
        server = serve(app, args.host, args.port)
    except (ValueError, OSError) as exc:  # a TLS file unusable, the port taken since it was checked
        service.stop()
        raise SystemExit(f"fedspeech coordinator: {cannot_serve(args.host, args.port, exc)}") from None
    logging.getLogger(__name__).info("dashboard at %s/, metrics at %s/metrics", server.url, server.url)
    if args.broker is not None:
        warn_if_unreachable(args.broker, "devices get no tasks")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    service.stop()


def _settings(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """The settings create_app will use: its defaults, then FEDSPEECH_* variables, then the options."""
    from flask import Config

    from fedspeech.coordinator.app import DEFAULTS

    settings = Config(".")
    settings.from_mapping(DEFAULTS)
    settings.from_prefixed_env("FEDSPEECH")
    settings.from_mapping(options)
    return settings


def _strategy_options(texts: list[str] | None) -> dict[str, str] | None:
    """--strategy-opt name=value, each once, as a mapping; None when none is given."""
    from fedspeech.coordinator.strategies.params import split_option

    if not texts:
        return None
    options: dict[str, str] = {}
    for text in texts:
        try:
            name, value = split_option(text)
        except ValueError as exc:
            raise SystemExit(f"fedspeech coordinator: --strategy-opt: {exc}") from None
        if name in options:
            raise SystemExit(f"fedspeech coordinator: --strategy-opt {name} given twice")
        options[name] = value
    return options


def _check_paths(args: argparse.Namespace) -> None:
    """SystemExit with one line for a file or folder option that names nothing."""
    for option, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path is not None and not Path(path).is_file():
            raise SystemExit(f"fedspeech coordinator: {option} {path}: no such file")
    folders = {
        "--eval-data": args.eval_data,
        "--validation-data": args.validation_data,
        "--server-data": args.server_data,
    }
    for option, folder in folders.items():
        if folder is not None and not Path(folder).is_dir():
            raise SystemExit(f"fedspeech coordinator: {option} {folder}: no such folder")


def _check_before_start(settings: Mapping[str, Any], args: argparse.Namespace) -> None:
    """SystemExit with one line for a bad task or strategy, or a port the coordinator could not listen on.

    The user's own files and names are checked first, then the machine's ports.
    """
    from fedspeech.coordinator.strategies import strategy_params
    from fedspeech.models.clips.tasks import TaskFileError, load_task

    try:
        load_task(settings["TASK"])
    except TaskFileError as exc:
        raise SystemExit(f"fedspeech coordinator: {exc}") from None
    try:
        strategy_params(settings["STRATEGY"], settings["STRATEGY_OPTIONS"])
    except ValueError as exc:
        raise SystemExit(f"fedspeech coordinator: {exc}") from None
    if not settings["BROKER_URL"]:
        host, broker_port = settings["EMBEDDED_BROKER_HOST"], int(settings["EMBEDDED_BROKER_PORT"])
        try:
            check_free(host, broker_port)
        except OSError as exc:
            raise SystemExit(_broker_port_message(host, broker_port, exc)) from None
    if args.port != 0:
        try:
            check_free(args.host, args.port)
        except OSError as exc:
            raise SystemExit(f"fedspeech coordinator: {cannot_serve(args.host, args.port, exc)}") from None


def _broker_port_message(host: str, broker_port: int, exc: OSError) -> str:
    """Why the embedded broker cannot listen on host:broker_port, and what to do, in one line."""
    text = (
        f"fedspeech coordinator: cannot start the embedded MQTT broker on {host}:{broker_port}: {reason(exc)}"
    )
    if exc.errno == errno.EADDRINUSE:
        text += (
            f"; a broker (Mosquitto?) may be listening there already: use it with --broker mqtt://{host}:"
            f"{broker_port}, or give the embedded broker a free port with --broker-port N"
        )
    return text


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `coordinator` and its options to the command line."""
    c = subparsers.add_parser("coordinator", help="run the coordinator service (HTTP API and round loop)")
    c.add_argument("--state", type=Path, default=Path("fedspeech-state"), help="state directory")
    c.add_argument("--broker", help="mqtt:// or mqtts:// (TLS) URL of an existing broker (default: embedded)")
    c.add_argument("--broker-port", type=port, help="port of the embedded broker (default 1883)")
    add_broker_options(c, "coordinator, with a password file")
    c.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    c.add_argument("--port", type=listen_port, default=8080, help="HTTP port")
    c.add_argument("--tls-cert", type=Path, metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    c.add_argument("--tls-key", type=Path, metavar="FILE", help="and this private key")
    c.add_argument(
        "--admin-token-file",
        type=Path,
        metavar="FILE",
        help="only the holder of the token in FILE may see the dashboard, /metrics and the device and round "
        "listings, and revoke devices over HTTP (default: anyone may read them; nobody may revoke over HTTP)",
    )
    c.add_argument("--http-timeout", type=seconds, help="seconds a connection may stay silent (default 30)")
    c.add_argument(
        "--open-enrolment",
        action="store_true",
        help="let unknown devices register without an enrolment secret (demos and emulated fleets)",
    )
    c.add_argument(
        "--max-devices", type=at_least(1), help="cap on devices under open enrolment (default 1000)"
    )
    c.add_argument(
        "--max-device-samples",
        type=at_least(1),
        help="cap on the samples an update may count for (default 100000)",
    )
    c.add_argument("--topic-root", default=DEFAULT_ROOT)
    c.add_argument("--task", help="a task file, or a built-in task: fsdd (default), emodb, speech_commands")
    c.add_argument(
        "--eval-every", type=at_least(0), help="devices evaluate every N rounds' model (default 1, 0: never)"
    )
    c.add_argument("--eval-devices", type=at_least(0), help="devices asked to evaluate (default: all online)")
    c.add_argument("--eval-timeout", type=float, help="seconds devices have to report an evaluation")
    c.add_argument("--eval-data", help="also evaluate centrally on a folder DIR/<label>/* of clips")
    c.add_argument(
        "--eval-corpus", choices=["fsdd", "emodb", "speech_commands"], help="or on its held-out set"
    )
    c.add_argument("--data-dir", help="folder holding the corpora (default: bundled data/)")
    c.add_argument("--eval-limit", type=at_least(1), help="evaluate centrally on at most this many clips")
    c.add_argument("--rounds", type=at_least(0), help="rounds to train (default 10)")
    c.add_argument("--min-devices", type=at_least(1), help="devices online before a round starts")
    c.add_argument("--min-results", type=at_least(1), help="updates needed to aggregate a round")
    c.add_argument("--round-timeout", type=float, help="seconds a device has to send its update")
    c.add_argument("--epochs", type=int, help="local epochs per round")
    c.add_argument("--batch-size", type=int)
    c.add_argument("--lr", type=float, help="local learning rate")
    c.add_argument(
        "--final-lr-fraction",
        type=float,
        help="the last round's learning rate as a fraction of --lr, along a cosine (default 1: constant)",
    )
    c.add_argument(
        "--server-momentum", type=float, help="momentum on the global model's step, FedAvgM (default 0)"
    )
    c.add_argument("--strategy", help=f"how devices are picked and weighted: {STRATEGY_NAMES}")
    c.add_argument(
        "--k",
        type=at_least(1),
        help="devices aggregated per round by top-K and random-K strategies; "
        "the results a fedbuff round closes on",
    )
    c.add_argument("--model", choices=MODELS, help="architecture (default: cnn; emotion_cnn for emodb)")
    c.add_argument("--depth", type=int, help="a transformer's full-grown number of encoder blocks")
    c.add_argument("--depth-schedule", help="constant, linear (default) or depths per stage, e.g. 1,2,4")
    c.add_argument(
        "--depth-stages", type=at_least(0), help="stages of the linear schedule (default: one per block)"
    )
    c.add_argument(
        "--new-blocks",
        choices=NEW_BLOCKS,
        help="how a block added by growth starts: fresh (default) or copied from the trained block below",
    )
    c.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="of the weights devices download and upload (default float32); float16 halves the bytes",
    )
    c.add_argument(
        "--strategy-opt",
        action="append",
        metavar="NAME=VALUE",
        help="one of the strategy's own settings, e.g. --strategy fedprox --strategy-opt mu=0.1 "
        "(README: Strategies lists each strategy's settings); repeat for several",
    )
    methods = c.add_argument_group("the coordinator's own clips, for the methods that use them")
    methods.add_argument(
        "--validation-data", help="quality: score each update on a folder DIR/<label>/* of clips"
    )
    methods.add_argument(
        "--shared-validation",
        type=at_least(0),
        metavar="N",
        help="quality: also take up to N clips from each device that opts in (default 0: none)",
    )
    methods.add_argument(
        "--server-data", help="mkd: the server model's clips, DIR/<label>/* or unlabelled in DIR"
    )
    c.set_defaults(run=run)
