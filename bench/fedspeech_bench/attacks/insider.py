"""An enrolled device that may be compromised, as a process of its own:
`python -m fedspeech_bench.attacks.insider ATTACK COORDINATOR BROKER TOPIC_ROOT STATE SPEAKER DEVICE SECRET
[--from-round N]`.

It is a device daemon on an FSDD speaker's clips whose trainer mounts ATTACK (fleets.poisoning's, or
"none" for an honest device): it trains honestly, then uploads what the attack makes of its update, from
round N on (1: every round). An attack of secure_insider's patches its part in the secure sum instead.
"""

import argparse
import logging
from pathlib import Path

from fedspeech.edge_client.daemon import ClientConfig, run_client
from fedspeech.edge_client.local_data import DataSource
from fedspeech.edge_client.trainer import Trainer
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech_bench.attacks import secure_insider
from fedspeech_bench.attacks.secure_insider import SECURE_ATTACKS
from fedspeech_bench.fleets.poisoning import ATTACKS, attacking_trainer

HONEST = "none"


def main() -> None:
    """Run the device daemon until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("attack", choices=[HONEST, *ATTACKS, *SECURE_ATTACKS])
    for name in ("coordinator", "broker", "topic_root", "state", "speaker", "device_id", "secret_file"):
        parser.add_argument(name)
    parser.add_argument("--from-round", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = ClientConfig(
        coordinator_url=args.coordinator,
        broker=BrokerSettings(args.broker),
        device_id=args.device_id,
        data=DataSource(corpus="fsdd", speaker=args.speaker),
        state_dir=Path(args.state) / args.device_id,
        topic_root=args.topic_root,
        enrolment_secret=Path(args.secret_file).read_text().strip(),
        make_trainer=attacking_trainer(args.attack, args.from_round) if args.attack in ATTACKS else Trainer,
    )
    config.check()
    if args.attack in SECURE_ATTACKS:
        secure_insider.mount(args.attack, args.from_round)
    run_client(config)


if __name__ == "__main__":
    main()
