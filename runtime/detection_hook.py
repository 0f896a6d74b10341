"""A command run on each detection (`fedspeech listen --on-detect CMD`), like wyoming-satellite's
`--detection-command`.

    hook = DetectionHook(shlex.split(text), spoken=lambda label: listener.model.spoken(label))
    listener = Listener(model, on_detection=hook)
    ...
    hook.close()

The command is an argv list run without a shell; what was detected reaches it in its environment only,
added to the inherited one (never pasted into its command line, so a label or a spoken form holding shell
metacharacters is data, not code):

    FEDSPEECH_LABEL       the label detected
    FEDSPEECH_SPOKEN      how it is said (the task's `say`), else the label
    FEDSPEECH_CONFIDENCE  its score, e.g. 0.9731
    FEDSPEECH_TIME        stream seconds at the end of its speech, e.g. 12.340
    FEDSPEECH_WALL_TIME   when it was detected, ISO 8601 in UTC, e.g. 2026-05-01T12:00:00.123+00:00
    FEDSPEECH_ROUND       the round of the model that heard it, empty for a model outside the rounds

NUL bytes are dropped from the values, characters UTF-8 cannot hold are replaced and each value is cut at
MAX_VALUE_CHARS, so that no model's metadata can stop the command from starting.

Calling the hook (the listener's on_detection, on the audio thread) only queues the detection: one worker
thread runs the command, once per detection and one at a time, in order. When the queue (queue_size) is
full the detection is dropped and logged. A run longer than timeout_s is killed with its process group (a
script's children too: each run starts a session of its own) and logged; a run that fails (a non-zero
status, a command gone or no longer executable) is logged with its status and the start of its stderr
(STDERR_BYTES), and the next detection runs the command again. Its stdout goes to /dev/null and its stderr
is read in chunks, only the first STDERR_BYTES kept, so a chatty command costs no memory. A process the
command leaves running in the background after it exits is left alone.
"""

import contextlib
import logging
import os
import queue
import selectors
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType

from fedspeech.runtime.streaming import Detection

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_QUEUE_SIZE = 8
STDERR_BYTES = 500  # the start of a failing run's stderr that is logged
MAX_VALUE_CHARS = 1000  # an environment value's length at most
CHUNK_BYTES = 65536  # stderr is read this much at a time
POLL_S = 0.1  # how often a run whose stderr is quiet is checked for having exited
KILL_WAIT_S = 5.0  # how long a killed run is waited for


@dataclass(frozen=True)
class _Job:
    """A detection waiting for the command: the values of its environment."""

    label: str
    environment: dict[str, str]


class DetectionHook:
    """Runs command (an argv list, never a shell) once per detection on a worker thread of its own, the
    detection in its environment; ValueError if the command is not an executable found now.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        spoken: Callable[[str], str] | None = None,
        stderr_bytes: int = STDERR_BYTES,
    ) -> None:
        self.command = list(command)
        check_command(self.command)
        if not timeout_s > 0:
            raise ValueError(f"the detection hook's timeout must be positive, not {timeout_s}")
        if queue_size < 1:
            raise ValueError(f"the detection hook's queue must hold at least one detection, not {queue_size}")
        self.timeout_s, self.stderr_bytes = timeout_s, stderr_bytes
        self._spoken = spoken
        self._queue: queue.Queue[_Job | None] = queue.Queue(queue_size)
        self._lock = threading.Lock()
        self._closed = False
        self.runs = self.failures = self.timeouts = self.dropped = 0  # counts, for a summary or a test
        self._thread = threading.Thread(target=self._work, name="detection-hook", daemon=True)
        self._thread.start()

    def __call__(self, detection: Detection) -> None:
        """Queue detection for the command (the listener's on_detection); never waits."""
        self.submit(detection)

    def submit(self, detection: Detection) -> bool:
        """Queue detection for the command; whether it was queued: not if the queue is full (logged) or the
        hook closed.
        """
        job = _Job(detection.label, environment(detection, self._say(detection.label)))
        with self._lock:
            if self._closed:
                log.debug("detection hook closed: %r at %.2f s not run", detection.label, detection.time_s)
                return False
            try:
                self._queue.put_nowait(job)
                return True
            except queue.Full:
                self.dropped += 1
                dropped = self.dropped
        log.warning(
            "detection hook busy: dropped the detection of %r at %.2f s, %d waiting (%d dropped so far)",
            detection.label,
            detection.time_s,
            self._queue.maxsize,
            dropped,
        )
        return False

    def close(self, finish_queued: bool = False) -> None:
        """Wait for the running command (up to its timeout) and end the worker; the detections still queued
        are dropped, or run first with finish_queued.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not finish_queued:
            left = 0
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
                left += 1
            if left:
                log.info("detection hook closing: %d queued detection(s) not run", left)
        queued = self._queue.qsize()
        self._queue.put(None)
        self._thread.join((queued + 1) * (self.timeout_s + KILL_WAIT_S + 1.0))
        if self._thread.is_alive():
            log.warning("the detection hook's worker did not end")

    def __enter__(self) -> "DetectionHook":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _say(self, label: str) -> str:
        """How label is said, by the hook's spoken; the label itself if there is none or it fails."""
        if self._spoken is None:
            return label
        try:
            return self._spoken(label)
        except Exception:
            log.exception("the spoken form of %r", label)
            return label

    def _work(self) -> None:
        """The worker: run the command for each queued detection until close."""
        while (job := self._queue.get()) is not None:
            try:
                self._run(job)
            except Exception:  # the worker goes on whatever a run does
                log.exception("detection hook for %r", job.label)

    def _run(self, job: _Job) -> None:
        """Run the command once for job, bounded in time and in what of its output is kept; log a failure."""
        name = self.command[0]
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env={**os.environ, **job.environment},
                start_new_session=True,  # its own process group, killed whole on a timeout
            )
        except OSError as exc:
            self.failures += 1
            log.warning("detection hook %s for %r could not start: %s", name, job.label, exc)
            return
        self.runs += 1
        try:
            stderr, timed_out = _read_until_done(process, started + self.timeout_s, self.stderr_bytes)
            if timed_out:
                _kill_group(process)
        finally:
            assert process.stderr is not None
            process.stderr.close()
        seconds = time.monotonic() - started
        excerpt = stderr.decode("utf-8", "replace").strip()
        if timed_out:
            self.timeouts += 1
            log.warning(
                "detection hook %s for %r killed after %.1f s (timeout %.1f s); stderr: %r",
                name,
                job.label,
                seconds,
                self.timeout_s,
                excerpt,
            )
        elif process.returncode != 0:
            self.failures += 1
            status = process.returncode
            how = f"killed by signal {-status}" if status < 0 else f"exited with status {status}"
            log.warning("detection hook %s for %r %s; stderr: %r", name, job.label, how, excerpt)
        else:
            log.debug("detection hook %s for %r done in %.2f s", name, job.label, seconds)


def split_command(text: str) -> list[str]:
    """A command line as an argv list, split as a POSIX shell would (shlex); ValueError if it is empty or
    its quotes are unbalanced.
    """
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"the detection hook's command {text!r}: {exc}") from None
    if not argv:
        raise ValueError("the detection hook's command is empty")
    return argv


def check_command(command: Sequence[str]) -> None:
    """ValueError unless command names an executable: a path to an executable file, or a name on PATH."""
    if not command:
        raise ValueError("the detection hook's command is empty")
    program = command[0]
    if os.sep in program or (os.altsep and os.altsep in program):
        if not os.path.isfile(program):
            raise ValueError(f"the detection hook's command {program!r} is no file")
        if not os.access(program, os.X_OK):
            raise ValueError(f"the detection hook's command {program!r} is not executable")
    elif shutil.which(program) is None:
        raise ValueError(f"the detection hook's command {program!r} is not found on PATH")


def environment(detection: Detection, spoken: str) -> dict[str, str]:
    """The variables that tell the command what was detected, each value safe to put in an environment."""
    values = {
        "FEDSPEECH_LABEL": detection.label,
        "FEDSPEECH_SPOKEN": spoken,
        "FEDSPEECH_CONFIDENCE": f"{detection.confidence:.4f}",
        "FEDSPEECH_TIME": f"{detection.time_s:.3f}",
        "FEDSPEECH_WALL_TIME": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "FEDSPEECH_ROUND": "" if detection.model_round is None else str(detection.model_round),
    }
    return {name: _safe_value(value) for name, value in values.items()}


def _safe_value(text: str) -> str:
    """text as an environment can hold it: no NUL, valid UTF-8, at most MAX_VALUE_CHARS characters."""
    text = text.replace("\0", "").encode("utf-8", "replace").decode("utf-8")
    return text[:MAX_VALUE_CHARS]


def _read_until_done(process: subprocess.Popen[bytes], deadline: float, keep: int) -> tuple[bytes, bool]:
    """Read process' stderr until it ends and process exits, or until deadline (monotonic); the first keep
    bytes of it and whether the deadline came first. The rest is read and thrown away, so the process
    never blocks on a full pipe.
    """
    assert process.stderr is not None
    kept = bytearray()
    descriptor = process.stderr.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(descriptor, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(kept), True
            if selector.select(min(remaining, POLL_S)):
                chunk = os.read(descriptor, CHUNK_BYTES)
                if not chunk:
                    break  # end of its stderr: it exits, or has
                kept += chunk[: max(0, keep - len(kept))]
            elif process.poll() is not None:
                return bytes(kept), False  # it exited; a process it left running holds its stderr open
    try:
        process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(kept), True
    return bytes(kept), False


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill process and every process of its group (its session's), and wait for it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the group's id is its leader's, not reaped yet
    try:
        process.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        log.error("detection hook %s (pid %d) did not die", process.args, process.pid)
