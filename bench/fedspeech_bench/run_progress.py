"""Progress of long commands: which run of how many, which round of how many, and about how long is left.

The time left (eta_s): a run not started takes as long as the runs finished so far took on average (their
device start-up included); before one has finished, as long as the current run's start-up to the end of
its first round plus its other rounds at the pace of its rounds since. The current run's rounds left go
at that pace too.
"""

import shutil
import sys
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TextIO

CLEAR_LINE = "\r\x1b[K"  # back to the start of the line, and erase it


def duration_text(seconds: float) -> str:
    """Seconds as 45s, 3m05s or 2h07m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_s(
    finished_s: Sequence[float],
    runs_after: int,
    rounds: int | None = None,
    round_ends: Sequence[float] = (),
    elapsed_s: float | None = None,
) -> float | None:
    """Seconds left, or None before there is anything to go by.

    finished_s: how long each run that finished took; runs_after: runs not started yet; rounds: a run's
    rounds (None: runs have none); round_ends: the current run's seconds from its start to the end of
    each round done; elapsed_s: seconds since the current run started (None: no run under way).
    """
    done = len(round_ends)
    pace = (round_ends[-1] - round_ends[0]) / (done - 1) if rounds is not None and done >= 2 else None
    if finished_s:
        per_run = sum(finished_s) / len(finished_s)
    elif pace is not None and rounds is not None:
        per_run = round_ends[0] + (rounds - 1) * pace
    else:
        return None
    if elapsed_s is None:
        current = 0.0
    elif pace is not None and rounds is not None:
        current = (rounds - done) * pace - (elapsed_s - round_ends[-1])
    else:
        current = per_run - elapsed_s
    return max(current, 0.0) + runs_after * per_run


def progress_line(
    run: int, runs: int, label: str, round_: int, rounds: int | None, elapsed_s: float, left_s: float | None
) -> str:
    """E.g. 'run 3/40 (fsdd fedavg seed 0): round 12/20, 21m05s elapsed, about 3h12m left'."""
    head = f"run {run}/{runs}" + (f" ({label})" if label else "") + ":"
    if rounds is not None:
        head += f" round {round_}/{rounds},"
    left = f", about {duration_text(left_s)} left" if left_s is not None else ""
    return f"{head} {duration_text(elapsed_s)} elapsed{left}"


class Progress:
    """Runs (of rounds) on stderr: a line per change, or on a terminal one line redrawn in place.

    Call start_run, round_done as rounds finish (repeats are ignored) and end_run; skip_run for a run
    that takes no time here. say() prints a result line on stdout without tearing the progress line.
    """

    def __init__(
        self,
        runs: int,
        rounds: int | None = None,  # None: runs have no rounds
        stream: TextIO | None = None,
        tty: bool | None = None,  # None: redraw in place if the stream is a terminal
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runs, self.rounds = runs, rounds
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.started = clock()
        self.run = 0  # runs started or skipped
        self.label = ""
        self.run_started: float | None = None  # None: no run under way
        self.round_ends: list[float] = []  # the current run's seconds from its start to each round's end
        self.finished: list[float] = []  # seconds each run that finished here took
        self._shown = False  # on a terminal: a line waits to be redrawn or ended

    def line(self) -> str:
        """The progress line now."""
        now = self.clock()
        elapsed = None if self.run_started is None else now - self.run_started
        left = eta_s(self.finished, self.runs - self.run, self.rounds, self.round_ends, elapsed)
        done = len(self.round_ends)
        return progress_line(self.run, self.runs, self.label, done, self.rounds, now - self.started, left)

    def start_run(self, label: str = "", rounds: int | None = None) -> None:
        """A run begins; rounds: its rounds, where they differ from the runs' before it."""
        self.run, self.label, self.run_started, self.round_ends = self.run + 1, label, self.clock(), []
        self.rounds = rounds if rounds is not None else self.rounds
        self._show()

    def round_done(self, round_: int) -> None:
        """The current run has done its rounds up to round_ (round 0, the initial model, is no round)."""
        if self.run_started is None or round_ <= len(self.round_ends):
            return
        now = self.clock() - self.run_started
        self.round_ends += [now] * (round_ - len(self.round_ends))
        self._show()

    def end_run(self) -> None:
        """The current run is over; if it did all its rounds, its time paces the runs to come."""
        if self.run_started is not None and (self.rounds is None or len(self.round_ends) >= self.rounds):
            self.finished.append(self.clock() - self.run_started)
        self.run_started = None

    def skip_run(self) -> None:
        """A run that needs no time here (done before): counted as done, and not in the pace."""
        self.run, self.run_started, self.round_ends = self.run + 1, None, []

    def say(self, text: str, file: TextIO | None = None) -> None:
        """Print a line (to stdout by default) above the progress line."""
        if self._shown:
            self.stream.write(CLEAR_LINE)
            self.stream.flush()
        print(text, file=file if file is not None else sys.stdout, flush=True)
        if self._shown:
            self._write()

    def close(self) -> None:
        """End a redrawn progress line so that what follows starts on a line of its own."""
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _show(self) -> None:
        if self.tty:
            self._shown = True
            self._write()
        else:
            print(self.line(), file=self.stream, flush=True)

    def _write(self) -> None:
        width = shutil.get_terminal_size().columns - 1  # a wrapped line could not be redrawn
        self.stream.write(CLEAR_LINE + self.line()[:width])
        self.stream.flush()
