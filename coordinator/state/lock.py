"""One coordinator per state folder: a process holds the folder's lock file for as long as it runs.

Two coordinators on one state would each run the rounds, write the same database and model files and
sign announcements with the same key. The lock is an advisory flock on a file in the folder, released
by the kernel when its holder exits, however it exits; the holder's pid is written in it, to be named.
"""

import fcntl
import os
from pathlib import Path
from typing import TextIO

LOCK_FILE = "coordinator.lock"


class StateInUse(Exception):
    """Another process holds the state folder."""


def hold_state(state_dir: Path) -> TextIO:
    """The open lock file of the folder state_dir, held until it is closed or the process ends;
    StateInUse naming the other coordinator's pid if another process holds it.
    """
    handle = open(state_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held open for the process' life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        other = handle.read(32).strip() or "unknown"
        handle.close()
        raise StateInUse(
            f"another coordinator (pid {other}) runs on the state folder {state_dir.resolve()}: stop it "
            "first, or give this one a --state of its own"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
