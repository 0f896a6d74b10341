"""`fedspeech coordinator`: its options and how they become the service's settings."""

import argparse
import signal
import threading
from pathlib import Path

from fedspeech.connection_options import add_broker_options, broker_settings
from fedspeech.models.architectures import MODELS
from fedspeech.protocol.topics import DEFAULT_ROOT

# names are checked where the strategy is made, so that the device commands never load coordinator code
STRATEGY_NAMES = "a strategy's name (README: Strategies)"


def run(args: argparse.Namespace) -> None:
    """`fedspeech coordinator`: the service from its options, until SIGTERM or SIGINT."""
    from fedspeech.coordinator.app import create_app, serve
    from fedspeech.models.tasks import TaskFileError

    if args.broker is not None:
        broker_settings(args, args.broker, "coordinator")  # one line for options that cannot work
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SystemExit("fedspeech coordinator: --tls-cert and --tls-key go together")
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
        "K": args.k,
        "MODEL": args.model,
        "MODEL_DEPTH": args.depth,
        "DEPTH_SCHEDULE": args.depth_schedule,
        "DEPTH_STAGES": args.depth_stages,
        "GROUPS": args.groups,
        "VALIDATION_DATA": args.validation_data,
        "QUALITY_TEMPERATURE": args.quality_temperature,
        "QUALITY_BY_SAMPLES": args.quality_by_samples or None,
        "PRIOR_WEIGHT": args.prior_weight,
        "SERVER_DATA": args.server_data,
        "SHARED_VALIDATION": args.shared_validation,
        "DISTILL_WEIGHT": args.distill_weight,
        "DISTILL_TEMPERATURE": args.distill_temperature,
    }
    try:
        app = create_app({k: v for k, v in config.items() if v is not None})
    except (TaskFileError, ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"fedspeech coordinator: {exc}") from None
    service = app.extensions["fedspeech"]
    service.start()
    try:
        server = serve(app, args.host, args.port)
    except (ValueError, OSError) as exc:  # a TLS file missing, the port taken
        service.stop()
        raise SystemExit(
            f"fedspeech coordinator: cannot serve HTTP on {args.host}:{args.port}: {exc}"
        ) from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    service.stop()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `coordinator` and its options to the command line."""
    c = subparsers.add_parser("coordinator", help="run the coordinator service (HTTP API and round loop)")
    c.add_argument("--state", type=Path, default=Path("fedspeech-state"), help="state directory")
    c.add_argument("--broker", help="mqtt:// or mqtts:// (TLS) URL of an existing broker (default: embedded)")
    c.add_argument("--broker-port", type=int, help="port of the embedded broker (default 1883)")
    add_broker_options(c, "coordinator, with a password file")
    c.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    c.add_argument("--port", type=int, default=8080, help="HTTP port")
    c.add_argument("--tls-cert", type=Path, metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    c.add_argument("--tls-key", type=Path, metavar="FILE", help="and this private key")
    c.add_argument("--http-timeout", type=float, help="seconds a connection may stay silent (default 30)")
    c.add_argument(
        "--open-enrolment",
        action="store_true",
        help="let unknown devices register without an enrolment secret (demos and emulated fleets)",
    )
    c.add_argument("--max-devices", type=int, help="cap on devices under open enrolment (default 1000)")
    c.add_argument(
        "--max-device-samples", type=int, help="cap on the samples an update may count for (default 100000)"
    )
    c.add_argument("--topic-root", default=DEFAULT_ROOT)
    c.add_argument("--task", help="a task file, or a built-in task: fsdd (default), emodb, speech_commands")
    c.add_argument(
        "--eval-every", type=int, help="devices evaluate every N rounds' model (default 1, 0: never)"
    )
    c.add_argument("--eval-devices", type=int, help="devices asked to evaluate (default: all online)")
    c.add_argument("--eval-timeout", type=float, help="seconds devices have to report an evaluation")
    c.add_argument("--eval-data", help="also evaluate centrally on a folder DIR/<label>/* of clips")
    c.add_argument(
        "--eval-corpus", choices=["fsdd", "emodb", "speech_commands"], help="or on its held-out set"
    )
    c.add_argument("--data-dir", help="folder holding the corpora (default: bundled data/)")
    c.add_argument("--eval-limit", type=int, help="evaluate centrally on at most this many clips")
    c.add_argument("--rounds", type=int)
    c.add_argument("--min-devices", type=int, help="devices online before a round starts")
    c.add_argument("--min-results", type=int, help="updates needed to aggregate a round")
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
    c.add_argument("--k", type=int, help="devices aggregated per round by top-K and random-K strategies")
    c.add_argument("--model", choices=MODELS, help="architecture (default: cnn; emotion_cnn for emodb)")
    c.add_argument("--depth", type=int, help="a transformer's full-grown number of encoder blocks")
    c.add_argument("--depth-schedule", help="constant, linear (default) or depths per stage, e.g. 1,2,4")
    c.add_argument("--depth-stages", type=int, help="stages of the linear schedule (default: one per block)")
    methods = c.add_argument_group("the methods' settings")
    methods.add_argument(
        "--groups", type=int, help="grouped: groups trained side by side (default 0: one per device)"
    )
    methods.add_argument(
        "--validation-data", help="quality: score each update on a folder DIR/<label>/* of clips"
    )
    methods.add_argument(
        "--shared-validation",
        type=int,
        metavar="N",
        help="quality: also take up to N clips from each device that opts in (default 0: none)",
    )
    methods.add_argument(
        "--quality-temperature", type=float, help="quality: weights softmax(score / T) (default 0.1)"
    )
    methods.add_argument(
        "--quality-by-samples", action="store_true", help="quality: weights also times samples"
    )
    methods.add_argument(
        "--prior-weight", type=float, help="class_prior: the regulariser's lambda (default 1)"
    )
    methods.add_argument(
        "--server-data", help="mkd: the server model's clips, DIR/<label>/* or unlabelled in DIR"
    )
    methods.add_argument(
        "--distill-weight", type=float, help="mkd: the devices' distillation term (default 1)"
    )
    methods.add_argument(
        "--distill-temperature", type=float, help="mkd: soft labels' temperature (default 2)"
    )
    c.set_defaults(run=run)
