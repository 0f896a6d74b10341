"""The `fedspeech` command: coordinator, client and demo subcommands."""

import argparse
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import NoReturn

from fedspeech.broker_config import add_parser as add_broker_config_parser
from fedspeech.connection_options import (
    add_broker_options,
    add_coordinator_trust_options,
    at_least,
    broker_settings,
    coordinator_key,
    coordinator_url,
    read_secret,
)
from fedspeech.coordinator_command import add_parser as add_coordinator_parser
from fedspeech.devices import add_parser as add_devices_parser
from fedspeech.evaluate import add_parser as add_eval_parser
from fedspeech.installed_commands import (
    KNOWN,
    add_installed_commands,
    extra_of,
    missing_command,
    needs,
    require_extra,
)
from fedspeech.listen_command import add_parser as add_listen_parser
from fedspeech.protocol import log_lines
from fedspeech.protocol.topics import DEFAULT_ROOT
from fedspeech.status import add_parser as add_status_parser
from fedspeech.synthesize import add_parser as add_synthesize_parser


def _client(args: argparse.Namespace) -> None:
    # SIGTERM while starting (before the daemon's own handlers) stops it as Ctrl-C does, with exit status 0
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):  # stopped before it went online: nothing to save yet
        _start_client(args)


def _start_client(args: argparse.Namespace) -> None:
    require_extra("client")  # before anything starts: torch is imported for the first task
    from fedspeech.edge_client.credentials import Refused
    from fedspeech.edge_client.daemon import ClientConfig, run_client, run_clients
    from fedspeech.edge_client.local_data import DataSource

    if (args.data is None) == (not args.speaker):
        raise SystemExit("fedspeech client: give --data DIR (own recordings) or --speaker (a corpus speaker)")
    if len(args.speaker) > 1 and args.device_id:
        raise SystemExit(
            "fedspeech client: --device-id names one device; with several --speaker each is named by its "
            "speaker"
        )
    if args.data is not None and not args.data.is_dir():
        raise SystemExit(f"fedspeech client: no data folder {args.data} (it holds one folder per label)")
    if args.data is not None:
        sources = [(args.device_id or _host_device_id(), DataSource(folder=args.data))]
    else:
        sources = [
            (args.device_id or s, DataSource(corpus=args.corpus, speaker=s, corpus_dir=args.data_dir))
            for s in args.speaker
        ]
    secret = read_secret(args.enrolment_secret_file, "enrolment secret", "client")
    if secret is not None and len(sources) > 1:
        raise SystemExit("fedspeech client: an enrolment secret is one device's; give one --speaker")
    configs = [
        ClientConfig(
            coordinator_url=coordinator_url(args),
            broker=broker_settings(args, args.broker, device_id),
            device_id=device_id,
            data=source,
            state_dir=args.state / device_id,
            enrolment_secret=secret,
            enrolment_secret_file=args.enrolment_secret_file,
            coordinator_key=coordinator_key(args),
            coordinator_ca=args.coordinator_ca,
            topic_root=args.topic_root,
            max_samples=args.max_samples,
            torch_threads=args.threads,
            model_dir=args.model_dir / device_id if args.model_dir and len(sources) > 1 else args.model_dir,
            share_validation=args.share_validation,
            mix_synthetic=args.mix_synthetic,
        )
        for device_id, source in sources
    ]
    try:
        for config in configs:
            config.check()
    except ValueError as exc:
        raise SystemExit(f"fedspeech client: {exc}") from None
    try:
        if len(configs) == 1:
            run_client(configs[0])
        else:
            run_clients(configs)
    except Refused as exc:
        raise SystemExit(f"fedspeech client: {exc}") from None


def _host_device_id() -> str:
    """This machine's host name as a device id."""
    import re
    import socket

    return re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:64] or "device"


def _record(args: argparse.Namespace) -> None:
    require_extra("record")
    from fedspeech.edge_client.recording import RecordConfig, RecordError, run_record
    from fedspeech.models.clips.tasks import TaskFileError, load_task

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop as on Ctrl-C, keeping what is saved
    try:
        config = RecordConfig(
            task=load_task(args.task),
            label=args.label,
            count=args.count,
            data=args.data,
            device=args.device,
            take_seconds=args.take_seconds,
        )
        run_record(config)
    except (TaskFileError, RecordError) as exc:
        raise SystemExit(f"fedspeech record: {exc}") from None


def _strategies(args: argparse.Namespace) -> None:
    from fedspeech.coordinator.strategies.catalogue import listing, settings_table

    print(settings_table() if args.markdown else listing(), end="")


class _Parser(argparse.ArgumentParser):
    """argparse, its errors one line and exit code 1 like every other mistake a user can make."""

    def error(self, message: str) -> NoReturn:
        """End with `PROG: MESSAGE; see `PROG --help``."""
        raise SystemExit(f"{self.prog}: {message}; see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per role."""
    parser = _Parser(prog="fedspeech", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True)

    add_coordinator_parser(sub)

    d = sub.add_parser("client", help="run the device daemon")
    d.add_argument("--coordinator", default="http://127.0.0.1:8080", help="coordinator base URL")
    d.add_argument("--broker", default="mqtt://127.0.0.1:1883", help="mqtt://host:port, or mqtts:// for TLS")
    d.add_argument("--device-id", help="device id (default: the host name, or the speaker)")
    d.add_argument("--data", type=Path, metavar="DIR", help="this device's recordings, one folder per label")
    d.add_argument(
        "--speaker",
        action="append",
        default=[],
        help="emulate a device from a corpus speaker's recordings (repeat it to host a device per speaker)",
    )
    d.add_argument("--corpus", default="fsdd", help="the corpus of --speaker (default fsdd)")
    d.add_argument("--data-dir", type=Path, help="folder holding the corpora (default: bundled data/)")
    d.add_argument("--topic-root", default=DEFAULT_ROOT)
    d.add_argument("--max-samples", type=at_least(1), help="train on at most this many local clips")
    d.add_argument("--threads", type=at_least(1), default=1, help="torch threads")
    d.add_argument("--model-dir", type=Path, help="keep the latest global model here as model.onnx")
    d.add_argument(
        "--state",
        type=Path,
        default=Path("fedspeech-device"),
        help="where the device keeps its token and the coordinator's key, in a folder per device id",
    )
    d.add_argument("--enrolment-secret-file", type=Path, metavar="FILE", help="from `fedspeech devices add`")
    d.add_argument(
        "--share-validation",
        type=at_least(0),
        default=0,
        metavar="N",
        help="send N training clips (their audio) to the coordinator to weigh updates by (default 0: none)",
    )
    d.add_argument(
        "--mix-synthetic",
        type=at_least(0),
        default=0,
        metavar="N",
        help="train on N takes of each word spoken by this machine's speech synthesizers too (default 0)",
    )
    add_coordinator_trust_options(d)
    add_broker_options(d, "the device id, with a password file")
    d.set_defaults(run=_client)

    add_devices_parser(sub)
    add_broker_config_parser(sub)
    add_status_parser(sub)

    r = sub.add_parser("record", help="record takes of one label from the microphone into a data folder")
    r.add_argument("--task", required=True, help="task file, or fsdd, emodb, speech_commands")
    r.add_argument("--label", required=True, help="the label spoken in these takes")
    r.add_argument("--count", type=int, default=10, help="takes to keep (default 10)")
    r.add_argument("--data", type=Path, required=True, help="the data folder; takes go to DATA/LABEL/")
    r.add_argument("--device", metavar="NAME|INDEX", help="PortAudio input device (default: the default)")
    r.add_argument("--take-seconds", type=float, help="listening time per take (default: clip + 2 s)")
    r.set_defaults(run=_record)

    add_installed_commands(sub)

    add_listen_parser(sub)
    add_eval_parser(sub)
    add_synthesize_parser(sub)
    st = sub.add_parser("strategies", help="every strategy with its settings, their defaults and bounds")
    st.add_argument("--markdown", action="store_true", help="the settings as the README's table")
    st.set_defaults(run=_strategies)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `fedspeech` command."""
    args, unknown = build_parser().parse_known_args(argv)
    missing_command(args)  # `fedspeech demo` without the benchmarks installed: one line, before its options
    if unknown:  # named here, after the subcommand, rather than by the top-level parser
        command = " ".join(filter(None, ("fedspeech", args.command, getattr(args, "bench", None))))
        raise SystemExit(f"{command}: unrecognized arguments: {' '.join(unknown)}; see `{command} --help`")
    quiet = args.command in KNOWN  # the benchmarks and the demo print their own progress lines
    level = logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO
    log_lines.configure(level)  # every line escaped: a value from the network cannot forge one
    if not args.verbose:
        for chatty in ("onnxscript", "onnx_ir"):  # the ONNX export's internals, at INFO every round
            logging.getLogger(chatty).setLevel(logging.WARNING)
    # `kill` stops a command as Ctrl-C does, so that what it started (the demo's devices) is stopped too;
    # the coordinator and the device daemon set their own handlers
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        args.run(args)
    except ModuleNotFoundError as exc:  # a module of an extra that is not installed, imported on the way
        extra = extra_of(exc.name, args.command)
        if extra is None:
            raise
        raise needs(args.command, str(exc.name), extra) from None
    except KeyboardInterrupt:  # Ctrl-C where a command had not set its own way to stop (start-up, say)
        command = " ".join(filter(None, ("fedspeech", args.command, getattr(args, "bench", None))))
        print(f"{command}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
