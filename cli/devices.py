"""`fedspeech devices`: enrol, revoke and list devices, on the coordinator's state or over its HTTP API."""

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedspeech.coordinator_api import CoordinatorApiError, add_admin_options, admin_request

if TYPE_CHECKING:  # the parser is built without coordinator code
    from fedspeech.coordinator.state.store import Store


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
            online = {"unknown": "not heard from on the broker"}.get(device["state"], device["state"])
            shared = "\ttwo devices register with this id" if device.get("shared_id") else ""
            print(f"{device['device_id']}\t{state}\t{online}{shared}")


def _on_state(args: argparse.Namespace) -> None:
    from fedspeech.coordinator.fleet.enrolment import revoke_device
    from fedspeech.coordinator.state.store import Store, holds_state

    folder = args.state.resolve()
    new = not holds_state(folder)
    if new and not (args.action == "add" and args.new_state):
        other = (
            "--new-state to start a coordinator's state there"
            if args.action == "add"
            else "--coordinator URL"
        )
        raise ValueError(f"no coordinator state in {folder}: give the coordinator's --state DIR, or {other}")
    store = Store(folder)
    if args.action == "add":
        _add(args, store, new)
    elif args.action == "revoke":
        store.check_writable()
        if not revoke_device(store, args.device_id):
            raise ValueError(f"no device {args.device_id!r}")
        print(f"revoked {args.device_id}: its token no longer works; it must be enrolled again")
    else:
        for device in store.devices():
            state = "registered" if device.registered else "enrolled, not registered yet"
            print(f"{device.device_id}\t{state}")
        print(
            "who is online: `fedspeech devices list --coordinator URL` asks the running coordinator",
            file=sys.stderr,
        )


def _add(args: argparse.Namespace, store: "Store", new: bool) -> None:
    """Enrol the device; its secret to --secret-file (mode 0600), else printed once on stdout."""
    from fedspeech.coordinator.fleet.enrolment import add_device, revoke_device
    from fedspeech.protocol.files import write_atomically

    store.check_writable()
    if args.secret_file is not None and not args.secret_file.parent.is_dir():
        raise ValueError(f"--secret-file {args.secret_file}: no folder {args.secret_file.parent}")
    secret = add_device(store, args.device_id)
    where = f"enrolled {args.device_id} into the {'new ' if new else ''}coordinator's state {store.dir}"
    if args.secret_file is None:
        print(secret)
        print(
            f"{where}; the secret above is shown only once. On the device, keep it in a file only the "
            "daemon's user can read (`--secret-file FILE` writes one) and pass --enrolment-secret-file FILE.",
            file=sys.stderr,
        )
        return
    try:
        write_atomically(args.secret_file, (secret + "\n").encode(), private=True)
    except OSError as exc:
        revoke_device(store, args.device_id)  # a secret nobody holds
        raise ValueError(
            f"cannot write {args.secret_file}: {exc.strerror}; {args.device_id} is not enrolled"
        ) from None
    print(
        f"{where}; its secret is in {args.secret_file} (mode 0600): copy it to the device and pass "
        "--enrolment-secret-file FILE",
        file=sys.stderr,
    )


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `devices add|revoke|list` to the command line."""
    dv = subparsers.add_parser(
        "devices", help="enrol, revoke and list devices (beside the coordinator's state, or over its API)"
    )
    actions = dv.add_subparsers(dest="action", required=True)
    texts = {
        "add": "enrol a device and print its secret once",
        "revoke": "revoke a device: its token stops working and it must be enrolled again",
        "list": "the devices the coordinator knows (with --coordinator: who is online)",
    }
    for action, text in texts.items():
        a = actions.add_parser(action, help=text)
        if action != "list":
            a.add_argument("device_id", metavar="ID")
        a.add_argument(
            "--state", type=Path, default=Path("fedspeech-state"), help="coordinator state directory"
        )
        if action == "add":
            a.add_argument(
                "--secret-file",
                type=Path,
                metavar="FILE",
                help="write the secret to FILE, readable by its owner only (mode 0600), not to stdout",
            )
            a.add_argument(
                "--new-state",
                action="store_true",
                help="start the coordinator's state in --state if it holds none yet (else refused: a "
                "device enrolled into a state no coordinator runs on is refused when it registers)",
            )
        else:
            add_admin_options(a, "instead of --state: the running coordinator's base URL")
    dv.set_defaults(run=run)
