"""`fedspeech devices`: enrol, revoke and list devices, on the coordinator's state or over its HTTP API."""

import argparse
import sys
from pathlib import Path

from fedspeech.coordinator_api import CoordinatorApiError, add_admin_options, admin_request


def run(args: argparse.Namespace) -> None:
    """`fedspeech devices add|revoke|list`: through --coordinator's API if given, else on --state."""
    try:
        if getattr(args, "coordinator", None):  # `devices add` works on the state only
            _over_http(args)
        else:
            _on_state(args)
    except (ValueError, CoordinatorApiError) as exc:
        raise SystemExit(f"fedspeech devices: {exc}") from None


def _over_http(args: argparse.Namespace) -> None:
    from fedspeech.protocol import routes

    if args.action == "add":
        raise ValueError(
            "a device is enrolled beside the coordinator's state (--state), where its secret is made"
        )
    if args.action == "revoke":
        admin_request(args, "DELETE", routes.device(args.device_id))
        print(f"revoked {args.device_id}: its token no longer works; it must be enrolled again")
    else:
        for device in admin_request(args, "GET", routes.DEVICES):
            state = "registered" if device["registered"] else "enrolled, not registered yet"
            print(f"{device['device_id']}\t{state}")


def _on_state(args: argparse.Namespace) -> None:
    from fedspeech.coordinator.enrolment import add_device, revoke_device
    from fedspeech.coordinator.store import Store

    if args.action != "add" and not (args.state / "state.sqlite3").exists():
        raise ValueError(f"no coordinator state in {args.state} (give --state, or --coordinator URL)")
    store = Store(args.state)
    if args.action == "add":
        secret = add_device(store, args.device_id)
        print(secret)
        print(
            f"enrolled {args.device_id}; the secret above is shown only once. On the device, keep it "
            "in a file only the daemon's user can read and pass --enrolment-secret-file FILE.",
            file=sys.stderr,
        )
    elif args.action == "revoke":
        if not revoke_device(store, args.device_id):
            raise ValueError(f"no device {args.device_id!r}")
        print(f"revoked {args.device_id}: its token no longer works; it must be enrolled again")
    else:
        for device in store.devices():
            state = "registered" if device.registered else "enrolled, not registered yet"
            print(f"{device.device_id}\t{state}")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `devices add|revoke|list` to the command line."""
    dv = subparsers.add_parser(
        "devices", help="enrol, revoke and list devices (beside the coordinator's state, or over its API)"
    )
    actions = dv.add_subparsers(dest="action", required=True)
    texts = {
        "add": "enrol a device and print its secret once",
        "revoke": "revoke a device: its token stops working and it must be enrolled again",
        "list": "the devices the coordinator knows",
    }
    for action, text in texts.items():
        a = actions.add_parser(action, help=text)
        if action != "list":
            a.add_argument("device_id", metavar="ID")
        a.add_argument(
            "--state", type=Path, default=Path("fedspeech-state"), help="coordinator state directory"
        )
        if action != "add":
            add_admin_options(a, "instead of --state: the running coordinator's base URL")
    dv.set_defaults(run=run)
