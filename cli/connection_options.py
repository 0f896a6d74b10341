"""Command-line options that say how to reach and trust the coordinator and the broker.

Shared by `fedspeech coordinator`, `client` and `listen`; each turns a setting that cannot work into one
line and exit code 1.
"""

import argparse
from pathlib import Path

from fedspeech.protocol.mqtt import BrokerSettings


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
    return settings


def read_secret(path: Path | None, what: str) -> str | None:
    """The first line of a secret's file, or None; SystemExit if it cannot be read."""
    if path is None:
        return None
    try:
        return path.read_text().strip()[:1024] or None
    except OSError as exc:
        raise SystemExit(f"fedspeech: cannot read the {what} {path}: {exc.strerror}") from None


def coordinator_key(args: argparse.Namespace) -> str | None:
    """The pinned coordinator key given as text or file, checked; SystemExit if it is not one."""
    from fedspeech.protocol.messages import ProtocolError
    from fedspeech.protocol.signing import load_public_key, public_key_text

    if args.coordinator_key is None:
        return None
    try:
        return public_key_text(load_public_key(args.coordinator_key))
    except (ProtocolError, OSError) as exc:
        raise SystemExit(f"fedspeech {args.command}: --coordinator-key: {exc}") from None
