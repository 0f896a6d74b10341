"""A second host for tests, on this machine: a network namespace joined to this one by a veth pair.

A defence that depends on the client's address (a cap per address) is shown with its attackers on such a
host and the honest clients on this one, never all on 127.0.0.1. The namespace, and with it the pair, is
removed when the test ends, however it ends.
"""

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class TestHost:
    """A network namespace: its name, its address, and this namespace's address on the link to it."""

    name: str
    address: str
    here: str

    def command(self, *args: str) -> list[str]:
        """A command line that runs args inside the namespace."""
        return ["ip", "netns", "exec", self.name, *args]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextmanager
def other_host() -> Iterator[TestHost]:
    """A namespace with one address, reachable from here, and from which this namespace is reachable."""
    pid = os.getpid()  # names and addresses of their own for each test process: workers run side by side
    name, outer, inner = f"fsh{pid}", f"fsh{pid}a", f"fsh{pid}b"
    prefix = f"10.{100 + pid // 250 % 100}.{pid % 250}"
    host = TestHost(name, f"{prefix}.2", f"{prefix}.1")
    try:
        _ip("netns", "add", name)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", name)
        _ip("addr", "add", f"{host.here}/30", "dev", outer)
        _ip("link", "set", outer, "up")
        _ip("-n", name, "addr", "add", f"{host.address}/30", "dev", inner)
        _ip("-n", name, "link", "set", inner, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield host
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)  # and the pair with it
        subprocess.run(
            ["ip", "link", "del", outer], capture_output=True, timeout=30
        )  # if the pair outlived it
