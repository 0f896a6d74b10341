"""`fedspeech listen`'s command line: its options, and the settings they make for `listen.run_listen`."""

import argparse
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from fedspeech.connection_options import (
    add_broker_options,
    add_coordinator_trust_options,
    broker_settings,
    coordinator_key,
    coordinator_url,
    seconds,
)
from fedspeech.installed_commands import require_extra
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import DEFAULT_ROOT

if TYPE_CHECKING:
    from fedspeech.listen_outputs import OutputConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `listen` and its options to the command line."""
    li = subparsers.add_parser(
        "listen", help="run the global model on a microphone or an audio file (no torch)"
    )
    source = li.add_mutually_exclusive_group()
    source.add_argument("--model", type=Path, metavar="FILE", help="a local ONNX model file")
    source.add_argument("--coordinator", metavar="URL", help="follow the models this coordinator announces")
    li.add_argument(
        "--broker", default="mqtt://127.0.0.1:1883", help="mqtt(s)://host:port, with --coordinator"
    )
    li.add_argument("--topic-root", default=DEFAULT_ROOT)
    li.add_argument(
        "--device-id",
        help="log in to the broker as this device's listener (<ID>-listen), with the password its daemon "
        "was issued (in --state)",
    )
    li.add_argument(
        "--state",
        type=Path,
        default=Path("fedspeech-device"),
        help="the device's state folder (the daemon's --state): the newest round seen announced, never to "
        "load an older one, and with --device-id the listener's broker password",
    )
    add_coordinator_trust_options(li)
    add_broker_options(li, "none: anonymous")
    audio = li.add_mutually_exclusive_group()
    audio.add_argument(
        "--input",
        type=Path,
        metavar="FILE",
        help="an audio file (soundfile formats) instead of a microphone; stereo is mixed down to mono and "
        "other sample rates are resampled to the model's with soxr",
    )
    audio.add_argument("--device", metavar="NAME|INDEX", help="PortAudio input device (default: the default)")
    audio.add_argument("--list-devices", action="store_true", help="list the audio devices and exit")
    li.add_argument("--realtime", action="store_true", help="pace --input at real speed (default: at once)")
    li.add_argument(
        "--duration", type=seconds, metavar="SECONDS", help="stop after this many seconds of audio"
    )
    li.add_argument("--hop-ms", type=float, help="classify a window every HOP_MS ms of speech (default 100)")
    li.add_argument(
        "--threshold",
        type=float,
        help="a word's score that detects it (default: the model's calibrated one, else 0.6)",
    )
    li.add_argument(
        "--no-vad",
        action="store_true",
        help="the energy gate alone, without Silero VAD's veto on noise and talk (README: Listening)",
    )
    li.add_argument("--timings", action="store_true", help="print ms per window for each stage at the end")
    _add_detection_options(li)
    li.set_defaults(run=_listen)


def _add_detection_options(li: argparse.ArgumentParser) -> None:
    """`fedspeech listen`'s options of where detections go (README: Using detections)."""
    d = li.add_argument_group("where detections go (README: Using detections)")
    d.add_argument(
        "--wyoming",
        metavar="tcp://HOST:PORT",
        help="serve Home Assistant (and any Wyoming client) as a wake-word and speech-to-text service "
        "instead of hearing a microphone or file",
    )
    d.add_argument("--language", default="en", help="the language a Wyoming client is told (default en)")
    d.add_argument(
        "--on-detect",
        metavar="CMD",
        help="run CMD (no shell) once per detection, with FEDSPEECH_LABEL, FEDSPEECH_SPOKEN, "
        "FEDSPEECH_CONFIDENCE, FEDSPEECH_TIME, FEDSPEECH_WALL_TIME and FEDSPEECH_ROUND in its environment",
    )
    d.add_argument(
        "--on-detect-timeout", type=float, default=10.0, metavar="SECONDS", help="kill CMD after (default 10)"
    )
    d.add_argument(
        "--publish",
        action="store_true",
        help="publish each detection over MQTT, with Home Assistant discovery, as this listener's broker "
        "user (<ID>-listen with --device-id)",
    )
    d.add_argument("--publish-broker", metavar="URL", help="publish on this broker, not the models' one")
    d.add_argument("--publish-username", help="log in to --publish-broker as (default: <ID>-listen)")
    d.add_argument("--publish-password-file", type=Path, metavar="FILE", help="its password")
    d.add_argument("--publish-ca", type=Path, metavar="FILE", help="CA of an mqtts:// --publish-broker")
    d.add_argument(
        "--discovery-prefix", default="homeassistant", help="Home Assistant's discovery prefix (default)"
    )
    d.add_argument("--no-discovery", action="store_true", help="publish without Home Assistant discovery")


def _listen(args: argparse.Namespace) -> None:
    if args.input is None and args.wyoming is None:  # the microphone, or --list-devices
        require_extra("listen")
    from fedspeech.listen import ListenConfig, ListenError, list_devices, run_listen
    from fedspeech.runtime.streaming import DetectorConfig

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop as on Ctrl-C, cleanly
    options = {"hop_ms": args.hop_ms, "threshold": args.threshold}
    detector = DetectorConfig(**{k: v for k, v in options.items() if v is not None}, voice=not args.no_vad)
    broker = _listen_broker(args)
    config = ListenConfig(
        model=args.model,
        coordinator_url=coordinator_url(args) if args.coordinator is not None else None,
        broker=broker,
        coordinator_key=coordinator_key(args),
        coordinator_ca=args.coordinator_ca,
        state_dir=args.state,
        topic_root=args.topic_root,
        input=args.input,
        device=args.device,
        realtime=args.realtime,
        duration_s=args.duration,
        detector=detector,
        timings=args.timings,
        wyoming=args.wyoming,
        language=args.language,
        outputs=_listen_outputs(args, broker),
    )
    try:
        if args.list_devices:
            print(list_devices())
        else:
            run_listen(config)
    except ListenError as exc:
        raise SystemExit(f"fedspeech listen: {exc}") from None


def _listen_outputs(args: argparse.Namespace, broker: BrokerSettings) -> "OutputConfig":
    """The options of the detections' destinations: --on-detect and --publish (named by the user it logs
    in as, which the broker's ACL knows it by).
    """
    from fedspeech.listen_outputs import OutputConfig
    from fedspeech.protocol.topics import listen_user
    from fedspeech.runtime.detection_hook import split_command

    try:
        on_detect = None if args.on_detect is None else split_command(args.on_detect)
    except ValueError as exc:
        raise SystemExit(f"fedspeech listen: {exc}") from None
    if args.on_detect_timeout <= 0:
        raise SystemExit("fedspeech listen: --on-detect-timeout must be positive")
    name = broker.username or (listen_user(args.device_id) if args.device_id else None)
    publish_broker = None
    if args.publish_broker is not None:
        name = args.publish_username or name
        publish_broker = BrokerSettings(
            url=args.publish_broker,
            username=name if args.publish_password_file else args.publish_username,
            password_file=args.publish_password_file,
            ca_file=args.publish_ca,
        )
        try:
            publish_broker.check()
        except ValueError as exc:
            raise SystemExit(f"fedspeech listen: --publish-broker: {exc}") from None
    return OutputConfig(
        on_detect=on_detect,
        on_detect_timeout_s=args.on_detect_timeout,
        publish=args.publish or args.publish_broker is not None,
        publish_name=name,
        publish_broker=publish_broker,
        discovery_prefix=None if args.no_discovery else args.discovery_prefix,
    )


def _listen_broker(args: argparse.Namespace) -> BrokerSettings:
    """The broker options, else the listener's password that the daemon of --device-id was issued."""
    from fedspeech.edge_client.credentials import LISTEN_PASSWORD_FILE, issued_login
    from fedspeech.protocol.topics import listen_user

    settings = broker_settings(args, args.broker, None)
    if args.device_id is None:
        return settings
    password_file = args.state / args.device_id / LISTEN_PASSWORD_FILE
    if settings.username is None and not password_file.is_file():
        logging.getLogger(__name__).warning(
            "no listener's broker password in %s (the device has not registered with a coordinator that "
            "issues them): logging in to the broker without one",
            password_file,
        )
    return issued_login(settings, listen_user(args.device_id), password_file)
