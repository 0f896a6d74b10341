"""Progress of a long job as log lines: how far it is and the time left, at most every few seconds."""

import logging
import time
from collections.abc import Callable

EVERY_S = 5.0  # between two lines


def progress_logger(what: str, log: logging.Logger, every_s: float = EVERY_S) -> Callable[[int, int], None]:
    """A callback (done, total) that logs "<what>: done of total, N s left" now and then, and at the end."""
    start = time.monotonic()
    last = [start]  # the first line after every_s too: a time left from the first item alone is a guess

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < every_s:
            return
        last[0] = now
        left = (now - start) / done * (total - done) if done else float("nan")
        tail = "done" if done >= total else f"about {left:.0f} s left"
        log.info("%s: %d of %d, %s", what, done, total, tail)

    return report
