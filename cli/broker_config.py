"""`fedspeech broker-config`: write Mosquitto's config, password file and ACL for the coordinator's state."""

import argparse
from pathlib import Path

from fedspeech.connection_options import port
from fedspeech.protocol.topics import DEFAULT_ROOT


def run(args: argparse.Namespace) -> None:
    """Write STATE/broker/ for the enrolled devices and say how to run Mosquitto with it."""
    from fedspeech.coordinator.broker import broker_users
    from fedspeech.coordinator.state.store import StateError, Store

    try:
        broker_users.check_topic_root(args.topic_root)  # before the state is touched
        device_ids = [device.device_id for device in Store(args.state).devices()]
        config = broker_users.write_config(args.state, args.host, args.port, args.topic_root, device_ids)
    except (StateError, ValueError) as exc:
        raise SystemExit(f"fedspeech broker-config: {exc}") from None
    except OSError as exc:
        raise SystemExit(f"fedspeech broker-config: cannot write {exc.filename}: {exc.strerror}") from None
    print(
        f"wrote {config.parent}: Mosquitto's config, its password file and ACL for the coordinator and "
        f"{len(device_ids)} device(s)\n"
        f"run Mosquitto with it:    mosquitto -c {config} -d\n"
        f"after `fedspeech devices add` or `revoke`, reload it:    {broker_users.reload_hint(args.state)}\n"
        f"`fedspeech coordinator --state {args.state} --broker mqtt://...` logs in as coordinator by itself; "
        "devices get their passwords when they register; Home Assistant logs in as homeassistant with the "
        f"password in {config.parent / 'homeassistant.password'} (it reads the listeners' detections)"
    )


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `broker-config` to the command line."""
    b = subparsers.add_parser(
        "broker-config",
        help="write a Mosquitto config, password file and ACL for the enrolled devices (STATE/broker/)",
    )
    b.add_argument("--state", type=Path, default=Path("fedspeech-state"), help="coordinator state directory")
    b.add_argument(
        "--host", default="127.0.0.1", help="address Mosquitto listens on (0.0.0.0: all; default 127.0.0.1)"
    )
    b.add_argument("--port", type=port, default=1883, help="port Mosquitto listens on (default 1883)")
    b.add_argument("--topic-root", default=DEFAULT_ROOT, help="the coordinator's --topic-root")
    b.set_defaults(run=run)
