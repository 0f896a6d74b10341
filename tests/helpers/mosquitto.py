"""A Mosquitto of the test's own, in the foreground with a config file such as `fedspeech broker-config`'s."""

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.mqtt_clients import WAIT_S, port_open
from tests.helpers.waiting import wait_for


@dataclass
class Mosquitto:
    """A running Mosquitto: its process and what it printed."""

    proc: subprocess.Popen
    output: Path

    def reload(self) -> None:
        """SIGHUP: Mosquitto reads its password file and ACL again."""
        self.proc.send_signal(signal.SIGHUP)

    def log(self) -> str:
        """What Mosquitto printed so far."""
        return self.output.read_text()


@contextmanager
def running_mosquitto(config: Path, port: int) -> Iterator[Mosquitto]:
    """Mosquitto with config, once it listens on 127.0.0.1:port; stopped (and its output printed) at the end.

    Started as root, Mosquitto would become user mosquitto, who may not read the files of the test's
    folders: then it runs a copy of config that keeps it root.
    """
    if os.geteuid() == 0:
        as_root = config.with_name(f".{config.name}.root")
        as_root.write_text(config.read_text() + "user root\n")
        config = as_root
    output = config.with_name("mosquitto.out")
    with open(output, "w") as out:
        proc = subprocess.Popen(["mosquitto", "-c", str(config)], stdout=out, stderr=subprocess.STDOUT)
    broker = Mosquitto(proc, output)

    def listening() -> bool:
        assert proc.poll() is None, f"mosquitto exited: {broker.log()}"
        return port_open(port)

    try:
        wait_for(listening, WAIT_S, "Mosquitto to listen")
        yield broker
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        print(broker.log())  # shown by pytest when the test failed
