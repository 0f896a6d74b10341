"""A Mosquitto of one's own, in the foreground with a config file such as `fedspeech broker-config`'s."""

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedspeech.connection_options import unreachable

START_S = 20.0


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
    """Mosquitto with config, once it listens on 127.0.0.1:port; stopped at the end (its output: .log()).

    Started as root with a config that names no user (as `fedspeech broker-config`'s does), Mosquitto
    would become user mosquitto, who may not read the files of one's own folders: then it runs a copy of
    config that keeps it root.
    """
    if os.geteuid() == 0 and not any(line.startswith("user ") for line in config.read_text().splitlines()):
        as_root = config.with_name(f".{config.name}.root")
        as_root.write_text(config.read_text() + "user root\n")
        config = as_root
    output = config.with_name("mosquitto.out")
    with open(output, "w") as out:
        proc = subprocess.Popen(["mosquitto", "-c", str(config)], stdout=out, stderr=subprocess.STDOUT)
    broker = Mosquitto(proc, output)

    try:
        deadline = time.monotonic() + START_S
        while not listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mosquitto did not start: {broker.log()}")
            time.sleep(0.1)
        yield broker
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    return unreachable("127.0.0.1", port, timeout=2) is None
