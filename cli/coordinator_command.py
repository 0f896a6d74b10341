"""`fedspeech coordinator`: its options and how they become the service's settings.

Every option but --config is also a setting of a config file (--config FILE) and of a FEDSPEECH_*
variable, and none has a default here: an option left out leaves the file's, the variable's or the
default setting (coordinator.config) in place.
"""

import argparse
import errno
import logging
import signal
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from fedspeech.connection_options import (
    add_broker_options,
    at_least,
    cannot_serve,
    check_free,
    listen_port,
    port,
    reason,
    seconds,
    warn_if_unreachable,
)
from fedspeech.defence_options import add_defence_options
from fedspeech.installed_commands import require_extra
from fedspeech.models.architectures import MODELS, NEW_BLOCKS
from fedspeech.privacy_options import add_dp_options, add_secure_options
from fedspeech.protocol.files import warn_if_readable
from fedspeech.protocol.topics import DEFAULT_ROOT
from fedspeech.protocol.weights import PRECISIONS

if TYPE_CHECKING:  # the device commands' parser is built without coordinator code
    from fedspeech.coordinator.config import CoordinatorConfig
    from fedspeech.coordinator.config_sources import Layer

# names are checked where the strategy is made, so that the device commands never load coordinator code
STRATEGY_NAMES = "a strategy's name (`fedspeech strategies` lists them with their settings)"


def run(args: argparse.Namespace) -> None:
    """`fedspeech coordinator`: the service from its settings, until SIGTERM or SIGINT."""
    require_extra("coordinator")
    from fedspeech.coordinator.app import TopicRootTaken, create_app, serve
    from fedspeech.coordinator.state.store import holds_state
    from fedspeech.models.clips.tasks import TaskFileError

    try:
        config, layers = settings(args)
    except ValueError as exc:
        raise SystemExit(f"fedspeech coordinator: {exc}") from None
    _check_paths(config, layers)
    _check_before_start(config)  # one line before anything starts or logs
    _warn_if_secrets_readable(config)
    state = config.service.state
    if not config.service.new_state and not holds_state(state):
        raise SystemExit(
            f"fedspeech coordinator: no coordinator state in {state.resolve()}: give your fleet's --state, "
            "or --new-state to start a new fleet there"
        )
    # held until this process ends; a new state is made by create_app, once the task and model are
    # checked, and held from then on
    held = _hold(state) if state.is_dir() else None
    try:
        app = create_app(config)
    except (TaskFileError, ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"fedspeech coordinator: {exc}") from None
    held = held or _hold(state)
    service = app.extensions["fedspeech"]
    try:
        service.start()
    except TopicRootTaken as exc:
        raise SystemExit(f"fedspeech coordinator: {exc}") from None
    except OSError as exc:  # the embedded broker's port, taken since it was checked
        if service.broker is None:
            raise
        raise SystemExit(_broker_port_message(service.broker.host, service.broker.port, exc)) from None
    host, http_port = config.service.host, config.service.port
    try:
        server = serve(app, host, http_port)
    except (ValueError, OSError) as exc:  # a TLS file unusable, the port taken since it was checked
        service.stop()
        raise SystemExit(f"fedspeech coordinator: {cannot_serve(host, http_port, exc)}") from None
    logging.getLogger(__name__).info("dashboard at %s/, metrics at %s/metrics", server.url, server.url)
    if config.service.broker is not None:
        warn_if_unreachable(config.service.broker, "devices get no tasks")
    stop, signalled = threading.Event(), []

    def on_signal(number: int, frame: object) -> None:
        signalled.append(signal.Signals(number).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    while not stop.wait(1.0):
        if service.link.refusal is not None:  # the topic root, checked once the broker answered, is taken
            break
    log = logging.getLogger(__name__)
    if signalled:
        log.info("stopping on %s: a round under way is run again from its start next time", signalled[0])
    server.stop()
    service.stop()
    held.close()
    rounds = service.store.rounds()
    done = f"round {rounds[-1].round}" if rounds else "no round"
    log.info(
        "stopped after %s; started again on %s, the coordinator goes on from there",
        done,
        config.service.state,
    )
    if service.link.refusal is not None:
        raise SystemExit(f"fedspeech coordinator: {service.link.refusal}")


def _hold(state: Path) -> TextIO:
    """The state folder's lock, held (coordinator.lock); SystemExit with one line if another process holds
    it or the folder takes no file."""
    from fedspeech.coordinator.state.lock import StateInUse, hold_state

    try:
        return hold_state(state)
    except StateInUse as exc:
        raise SystemExit(f"fedspeech coordinator: {exc}") from None
    except OSError as exc:
        raise SystemExit(
            f"fedspeech coordinator: cannot write the state directory {state.resolve()} ({exc.strerror}): "
            "give a folder this user may write with --state, or make this one writable"
        ) from None


def settings(
    args: argparse.Namespace, environ: "Mapping[str, str] | None" = None
) -> "tuple[CoordinatorConfig, list[Layer]]":
    """The service's settings: defaults < --config FILE < FEDSPEECH_* variables < options, and the layers.
    ValueError (a ConfigError naming the option, the variable or the file) for a setting that cannot be.
    """
    from fedspeech.coordinator.config_sources import combine, source_layers

    layers = source_layers(args, environ)
    config = combine(*layers)
    rounds = config.rounds
    if rounds.privacy is not None and rounds.dp_noise_multiplier is None and rounds.dp_epsilon:
        logging.getLogger(__name__).info(
            "noise multiplier %.4g: the least that keeps %d rounds within epsilon %g",
            rounds.privacy.noise_multiplier, rounds.rounds, rounds.dp_epsilon,
        )  # fmt: skip
    return config, layers


def _check_paths(config: "CoordinatorConfig", layers: "Sequence[Layer]") -> None:
    """SystemExit with one line naming where it was given, for a file or folder setting naming nothing."""
    from fedspeech.coordinator.config_sources import where

    service = config.service
    init = None if service.init in ("random", "synthetic") else Path(service.init)
    for name, path in (("tls_cert", service.tls_cert), ("tls_key", service.tls_key), ("init", init)):
        if path is not None and not path.is_file():
            choices = ": give random, synthetic or a .safetensors file" if name == "init" else ""
            raise SystemExit(f"fedspeech coordinator: {where(name, layers)} {path}: no such file{choices}")
    folders = {
        "eval_data": config.evaluation.eval_data,
        "validation_data": service.validation_data,
        "server_data": service.server_data,
        "init_data": service.init_data,
    }
    for name, folder in folders.items():
        if folder is not None and not folder.is_dir():
            raise SystemExit(f"fedspeech coordinator: {where(name, layers)} {folder}: no such folder")


def _warn_if_secrets_readable(config: "CoordinatorConfig") -> None:
    """A warning for each of the coordinator's secret files that other users may read."""
    service = config.service
    secrets = {
        "admin token": service.admin_token_file,
        "broker password": service.broker_password_file,
        "broker client key": service.broker_key,
        "TLS key": service.tls_key,
    }
    for what, path in secrets.items():
        warn_if_readable(path, what)


def _check_before_start(config: "CoordinatorConfig") -> None:
    """SystemExit with one line for a bad task, or a port the coordinator could not listen on.

    The user's own files are checked first, then the machine's ports.
    """
    from fedspeech.models.clips.tasks import TaskFileError, load_task

    service = config.service
    try:
        load_task(service.task)
    except TaskFileError as exc:
        raise SystemExit(f"fedspeech coordinator: {exc}") from None
    if not service.broker:
        host, broker_port = service.embedded_broker_host, service.broker_port
        try:
            check_free(host, broker_port)
        except OSError as exc:
            raise SystemExit(_broker_port_message(host, broker_port, exc)) from None
    if service.port != 0:
        host, http_port = service.host, service.port
        try:
            check_free(host, http_port)
        except OSError as exc:
            raise SystemExit(f"fedspeech coordinator: {cannot_serve(host, http_port, exc)}") from None


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
    c.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="settings from a TOML file (README: Configuration); options given here override it",
    )
    c.add_argument("--state", type=Path, help="state directory (default fedspeech-state)")
    c.add_argument(
        "--new-state",
        action="store_true",
        default=None,
        help="start a new fleet's state in --state if it holds none yet (else refused: a mistyped --state "
        "would start a new fleet); a state that exists is used either way",
    )
    c.add_argument("--broker", help="mqtt:// or mqtts:// (TLS) URL of an existing broker (default: embedded)")
    c.add_argument("--broker-port", type=port, help="port of the embedded broker (default 1883)")
    add_broker_options(c, "coordinator, with a password file")
    c.add_argument("--host", help="HTTP bind address (default 127.0.0.1)")
    c.add_argument("--port", type=listen_port, help="HTTP port (default 8080)")
    c.add_argument("--tls-cert", type=Path, metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    c.add_argument("--tls-key", type=Path, metavar="FILE", help="and this private key")
    c.add_argument(
        "--admin-token-file",
        type=Path,
        metavar="FILE",
        help="only the holder of the token in FILE may see the dashboard, /metrics and the device and round "
        "listings, and revoke devices over HTTP (default: anyone may read them; nobody may revoke over HTTP)",
    )
    c.add_argument(
        "--http-timeout",
        type=seconds,
        help="seconds a request may take to arrive, headers and body, and its answer to be read (default 30)",
    )
    c.add_argument(
        "--open-enrolment",
        action="store_true",
        default=None,
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
    c.add_argument(
        "--sample-growth",
        type=float,
        help="the fraction by which a device's counted samples may grow a round (default 0.25)",
    )
    c.add_argument(
        "--samples-over-median",
        type=float,
        help="the most samples a device counts for, as a multiple of the fleet's median (default 3)",
    )
    add_defence_options(c)
    add_secure_options(c)
    add_dp_options(c)
    c.add_argument("--topic-root", help=f"root of the MQTT topics (default {DEFAULT_ROOT})")
    c.add_argument(
        "--take-over-topic-root",
        action="store_true",
        default=None,
        help="announce on a topic root whose retained model announcement another coordinator signed "
        "(otherwise refused: one broker, one coordinator per topic root)",
    )
    c.add_argument("--task", help="a task file, or a built-in task: fsdd (default), emodb, speech_commands")
    c.add_argument(
        "--init",
        metavar="HOW",
        help="a new fleet's first model: random (default), synthetic (trained here first on the task's words "
        "spoken by the machine's speech synthesizers) or FILE.safetensors",
    )
    c.add_argument(
        "--init-data",
        metavar="DIR",
        help="a folder DIR/<label>/* of speech the first model also trains on (a public corpus, say)",
    )
    c.add_argument(
        "--init-takes", type=at_least(1), metavar="N", help="synthetic takes of each word (default 300)"
    )
    c.add_argument(
        "--init-epochs", type=at_least(1), metavar="N", help="epochs the first model trains (default 12)"
    )
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
    c.add_argument("--rounds", type=at_least(1), help="rounds to train (default 10)")
    c.add_argument("--min-devices", type=at_least(1), help="devices online before a round starts")
    c.add_argument("--min-results", type=at_least(1), help="updates needed to aggregate a round")
    c.add_argument("--round-timeout", type=float, help="seconds a device has to send its update")
    c.add_argument(
        "--ack-timeout",
        type=float,
        help="seconds a device has to acknowledge its task before a round goes on without it (default 10)",
    )
    c.add_argument(
        "--straggler-grace",
        type=float,
        help="once half a round's devices have uploaded, the others have this many times the time that took "
        "(at least 2 s) before the round closes without them (default 3; 0: until --round-timeout)",
    )
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
        "--strategy-setting",
        dest="strategy_settings",
        action="append",
        metavar="NAME=VALUE",
        help="one of the strategy's own settings, e.g. --strategy fedprox --strategy-setting mu=0.1 "
        "(`fedspeech strategies` lists each strategy's settings); repeat for several",
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
