"""Command-line options that say how to reach and trust the coordinator and the broker.

Shared by `fedspeech coordinator`, `client` and `listen`; each turns a setting that cannot work into one
line and exit code 1. Also the argument types the commands share (ports, counts, durations) and the
checks that a port is free and a peer listens, made before a command starts anything.
"""

import argparse
import errno
import logging
import socket
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from fedspeech.protocol.files import warn_if_readable
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import parse_broker_url

log = logging.getLogger(__name__)


def add_coordinator_trust_options(parser: argparse.ArgumentParser) -> None:
    """How a device or listener knows its coordinator: the pinned signing key and the HTTPS CA."""
    parser.add_argument(
        "--coordinator-key",
        metavar="KEY|FILE",
        help="the coordinator's public key (its state/coordinator.pub), base64 or a file; default: the key "
        "the coordinator names when the device first registers, then kept",
    )
    parser.add_argument("--coordinator-ca", type=Path, metavar="FILE", help="CA of the coordinator's HTTPS")


def add_broker_options(parser: argparse.ArgumentParser, username_default: str) -> None:
    """The options that say how to log in to the broker, shared by coordinator, client and listen."""
    parser.add_argument("--broker-username", help=f"broker user name (default: {username_default})")
    parser.add_argument("--broker-password-file", type=Path, metavar="FILE", help="the broker password")
    parser.add_argument("--broker-ca", type=Path, metavar="FILE", help="CA of the broker's TLS certificate")
    parser.add_argument("--broker-cert", type=Path, metavar="FILE", help="client certificate for the broker")
    parser.add_argument("--broker-key", type=Path, metavar="FILE", help="its private key")


def broker_settings(args: argparse.Namespace, url: str, username: str | None) -> BrokerSettings:
    """The broker options as settings; SystemExit with one line for settings that cannot work."""
    settings = BrokerSettings(
        url=url,
        username=args.broker_username or (username if args.broker_password_file else None),
        password_file=args.broker_password_file,
        ca_file=args.broker_ca,
        cert_file=args.broker_cert,
        key_file=args.broker_key,
    )
    try:
        settings.check()
    except ValueError as exc:
        raise SystemExit(f"fedspeech {args.command}: {exc}") from None
    warn_if_readable(settings.password_file, "broker password")
    warn_if_readable(settings.key_file, "broker client key")
    return settings


SECRETS_MADE_BY = {"enrolment secret": ", the one `fedspeech devices add` printed or wrote to --secret-file"}


def read_secret(path: Path | None, what: str, command: str = "") -> str | None:
    """The first line of a secret's file, or None without a file; SystemExit if it cannot be read or holds
    nothing; a warning if others may read it.
    """
    if path is None:
        return None
    warn_if_readable(path, what)
    prefix = f"fedspeech {command}".strip()
    try:
        secret = path.read_text().strip()[:1024]
    except OSError as exc:
        raise SystemExit(f"{prefix}: cannot read the {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        secret = None
    if not secret:
        wrong = "is empty" if secret == "" else "is not text"
        made_by = SECRETS_MADE_BY.get(what, "")
        raise SystemExit(
            f"{prefix}: the {what} file {path} {wrong}: put the {what} on its first line{made_by}"
        )
    return secret


def coordinator_url(args: argparse.Namespace) -> str:
    """The --coordinator URL, checked to be http(s)://host[:port]; SystemExit with one line if it is not."""
    url = args.coordinator
    try:
        parts = urllib.parse.urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number, or out of range
        usable = False
    if not usable:
        raise SystemExit(
            f"fedspeech {args.command}: --coordinator {url!r} is not a coordinator's URL: give "
            "http://HOST:PORT (or https://), e.g. http://127.0.0.1:8080"
        )
    return url


def port(text: str) -> int:
    """argparse type: a TCP port number, 1 to 65535."""
    value = _integer(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number: give 1 to 65535")
    return value


def listen_port(text: str) -> int:
    """argparse type: a port to listen on, 1 to 65535, or 0 for any free one."""
    value = _integer(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"{value} is not a port number: give 1 to 65535, or 0 for any free one"
        )
    return value


def at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer no smaller than minimum."""

    def count(text: str) -> int:
        value = _integer(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return count


def seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def check_free(host: str, port: int) -> None:
    """OSError if a server could not listen on host:port now: the port taken, or host not this machine's.

    Bound the way the servers bind (SO_REUSEADDR), so that a port left in TIME_WAIT counts as free.
    """
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
                return
            except OSError as exc:
                error = error or exc
    if error is not None:
        raise error


def unreachable(host: str, port: int, timeout: float = 3.0) -> str | None:
    """Why nothing answers a TCP connection to host:port (e.g. 'connection refused'), or None if it does."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return reason(exc)


def cannot_serve(host: str, port: int, exc: OSError | ValueError) -> str:
    """Why an HTTP server cannot listen on host:port, and what to do, in one line."""
    text = f"cannot serve HTTP on {host}:{port}: {reason(exc) if isinstance(exc, OSError) else exc}"
    code = getattr(exc, "errno", None)
    if code == errno.EADDRINUSE:
        text += " (another coordinator running? give a free port with --port N)"
    elif code == errno.EACCES:
        text += " (a port below 1024 needs root: give --port N above 1023)"
    elif code == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        text += " (--host must be an address of this machine: 127.0.0.1, or 0.0.0.0 for all)"
    return text


def warn_if_unreachable(url: str, waiting: str) -> None:
    """Log one warning if nothing answers at the broker URL now: the MQTT client retries without a word.

    waiting says what waits for the broker meanwhile. A bare TCP probe: the embedded broker (amqtt) logs
    it as an error, so only for a broker of the operator's own (Mosquitto).
    """
    why = unreachable(*parse_broker_url(url))
    if why is not None:
        log.warning(
            "cannot reach the broker at %s (%s): %s; trying again until it answers", url, why, waiting
        )


def reason(exc: OSError) -> str:
    """An OSError in a few words: its strerror in lower case (e.g. 'address already in use'), or its text."""
    return exc.strerror.lower() if exc.strerror else str(exc)


def coordinator_key(args: argparse.Namespace) -> str | None:
    """The pinned coordinator key given as text or file, checked; SystemExit if it is not one."""
    from fedspeech.protocol.bounds import ProtocolError
    from fedspeech.protocol.signing import load_public_key, public_key_text

    if args.coordinator_key is None:
        return None
    try:
        return public_key_text(load_public_key(args.coordinator_key))
    except (ProtocolError, OSError) as exc:
        raise SystemExit(f"fedspeech {args.command}: --coordinator-key: {exc}") from None


def results_folder(command: str, out: Path) -> None:
    """Make the results folder; SystemExit with one line if it cannot be one."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"fedspeech {command}: --out {out} is a file: give a folder for the results")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(
            f"fedspeech {command}: cannot make the results folder {out}: {reason(exc)}"
        ) from None
