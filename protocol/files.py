"""Files replaced whole (readers see the old content or the new one, never half, even after a crash), and
secret files checked for being private."""

import logging
import os
import stat
import threading
from pathlib import Path

log = logging.getLogger(__name__)


def write_atomically(path: Path, data: bytes, private: bool = False) -> None:
    """Write data to path through a synced temporary file beside it, renamed over path once complete.

    A private file (a key, a token) is readable by its owner only, from the moment it is created.
    """
    path = Path(path)
    # hidden (data folders pass over dot files) and unique, so that two writers never share a temporary file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    mode = 0o600 if private else 0o666  # less the umask, as open() does
    try:
        with open(tmp, "wb", opener=lambda name, flags: os.open(name, flags, mode)) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a power cut
    finally:
        os.close(folder)


def warn_if_readable(path: Path | None, what: str) -> None:
    """Log one warning if the secret in path may be read by users other than its owner."""
    if path is None:
        return
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return  # the file's reader says why it cannot be read
    if mode & 0o044:
        log.warning(
            "the %s %s is readable by other users (mode %03o): make it private with `chmod 600 %s`",
            what, path, mode, path,
        )  # fmt: skip
