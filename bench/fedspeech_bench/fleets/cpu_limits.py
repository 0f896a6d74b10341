"""Run a process at a share of one core: a cgroup CPU quota where writable, a duty-cycle throttle otherwise.

Under cgroup v1 the quota goes in cpu.cfs_quota_us, under v2 in cpu.max; where neither can be written
(an unprivileged container, a cgroup that holds processes itself) a thread stops and continues the
process' group. The process is never told: it measures its own speed (edge_client/profile.py).
"""

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fedspeech.edge_client.profile import cgroup_dirs
from fedspeech_bench.fleets.network_proxy import DelayProxy

log = logging.getLogger(__name__)

# A CFS period shorter than the kernel's default 100 ms: the quota comes in small slices, so a slow
# device is never frozen for long stretches (at 8 % of a core and 100 ms it would run 8 ms, then stall
# 92 ms, holding up its MQTT keep-alives and replies) and a short measurement sees the average share.
# Raised where the quota would fall under the kernel's 1 ms minimum.
CFS_PERIOD_US = 20_000
_MIN_QUOTA_US = 1_000
DUTY_CYCLE_S = 0.02  # the duty-cycle throttle's period: run share * 20 ms, stop the rest
_MIN_RUN_S = 0.002
CGROUP_GROUP = "fedspeech"  # our cgroups live in <own cgroup>/fedspeech/<device>-<random>/
METHODS = ("cgroup-v1", "cgroup-v2", "duty-cycle", "none")
# a device's share is of one core: keep OpenMP, OpenBLAS and MKL pools to one thread
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _cfs_period_quota(share: float) -> tuple[int, int]:
    period = CFS_PERIOD_US
    if share * period < _MIN_QUOTA_US:
        period = int(_MIN_QUOTA_US / share) + 1
    return period, max(_MIN_QUOTA_US, round(share * period))


def _mkdir_group_child(path: Path) -> None:
    """mkdir <group>/<device>; another launcher may remove an emptied <group>/ meanwhile, so retry."""
    for attempt in range(3):
        try:
            path.parent.mkdir(exist_ok=True)
            path.mkdir()
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def _make_cgroup_v1(name: str, share: float) -> Path | None:
    """A v1 cpu cgroup with the quota set, or None where there is none or it is not writable."""
    dirs = cgroup_dirs("cpu")
    if not dirs or not (dirs[0] / "cpu.cfs_quota_us").exists():
        return None
    path = dirs[0] / CGROUP_GROUP / name
    period, quota = _cfs_period_quota(share)
    try:
        _mkdir_group_child(path)
        _write(path / "cpu.cfs_period_us", str(period))
        _write(path / "cpu.cfs_quota_us", str(quota))
    except OSError as exc:
        log.debug("cgroup v1 cpu quota not available: %s", exc)
        _remove_cgroup(path, timeout=0.0)
        return None
    return path


def _make_cgroup_v2(name: str, share: float) -> Path | None:
    """A v2 cgroup with cpu.max set, or None where the cpu controller cannot be delegated to it."""
    dirs = cgroup_dirs("")
    if not dirs:
        return None
    own = dirs[0]
    group, path = own / CGROUP_GROUP, own / CGROUP_GROUP / name
    period, quota = _cfs_period_quota(share)
    try:
        if "cpu" not in (own / "cgroup.controllers").read_text().split():
            return None
        # enabling a controller for children fails (EBUSY) where our own cgroup holds processes and is
        # not the root: the "no internal processes" rule; then the duty-cycle throttle takes over
        if "cpu" not in (own / "cgroup.subtree_control").read_text().split():
            _write(own / "cgroup.subtree_control", "+cpu")
        group.mkdir(exist_ok=True)
        if "cpu" not in (group / "cgroup.subtree_control").read_text().split():
            _write(group / "cgroup.subtree_control", "+cpu")
        _mkdir_group_child(path)
        _write(path / "cpu.max", f"{quota} {period}")
    except OSError as exc:
        log.debug("cgroup v2 cpu.max not available: %s", exc)
        _remove_cgroup(path, timeout=0.0)
        return None
    return path


def _remove_cgroup(path: Path, timeout: float = 5.0) -> None:
    """rmdir a cgroup; the kernel refuses (EBUSY) while a task is still leaving it, so retry briefly."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            log.warning("could not remove cgroup %s: %s", path, exc)
            return
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # the shared fedspeech/ group, once no other device uses it
        return


class _DutyCycle(threading.Thread):
    """Let a process group run share * cycle seconds, then stop it for the rest of each cycle."""

    def __init__(self, proc: subprocess.Popen, share: float, cycle_s: float = DUTY_CYCLE_S) -> None:
        super().__init__(name=f"duty-cycle-{proc.pid}", daemon=True)
        # a run slice much under 2 ms would be mostly the launcher's timer and signal latency
        cycle_s = max(cycle_s, _MIN_RUN_S / share)
        self.proc, self.run_s, self.stop_s = proc, share * cycle_s, (1.0 - share) * cycle_s
        self._done = threading.Event()

    def _signal(self, sig: int) -> bool:
        if self.proc.returncode is not None:  # reaped: its pid may already belong to someone else
            return False
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def run(self) -> None:
        """Alternate SIGCONT and SIGSTOP on the schedule until stopped or the process is gone."""
        edge = time.monotonic()
        try:
            while not self._done.is_set():
                if not self._signal(signal.SIGCONT):
                    return
                edge += self.run_s
                self._done.wait(max(0.0, edge - time.monotonic()))
                if self._done.is_set() or not self._signal(signal.SIGSTOP):
                    return
                edge += self.stop_s
                self._done.wait(max(0.0, edge - time.monotonic()))
                # fell far behind (launcher starved): restart the schedule instead of catching up
                edge = max(edge, time.monotonic() - self.run_s - self.stop_s)
        finally:
            self._signal(signal.SIGCONT)

    def stop(self) -> None:
        """End the schedule, leaving the process continued."""
        self._done.set()
        self.join(timeout=5)


@dataclass
class DeviceProcess:
    """A started, CPU-limited process: .proc is the Popen, .method how it is limited."""

    proc: subprocess.Popen
    method: str
    share: float
    cgroup: Path | None = None
    proxies: list[DelayProxy] = field(default_factory=list)
    _throttle: _DutyCycle | None = None
    _log: IO | None = None

    def terminate(self) -> None:
        """End the throttle (leaving the process continued, so it can handle SIGTERM) and SIGTERM it."""
        if self._throttle is not None:
            self._throttle.stop()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait, SIGKILL if needed; then remove the cgroup, stop the throttle and the proxies."""
        try:
            self.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        finally:
            if self.cgroup is not None:
                _remove_cgroup(self.cgroup)
                self.cgroup = None
            for proxy in self.proxies:
                proxy.stop()
            self.proxies = []
            if self._log is not None:
                self._log.close()
                self._log = None
        return self.proc.returncode


def run_limited(
    share: float,
    argv: list[str],
    *,
    name: str = "proc",
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    method: str | None = None,
    proxies: list[DelayProxy] | None = None,
    stdout: int | IO | None = None,
) -> DeviceProcess:
    """Run argv limited to `share` of one core; method None picks cgroup v1, then v2, then duty-cycle.

    Under a cgroup the process is started through `sh`, which puts itself in the cgroup and then execs
    argv, so the limit holds from the first instruction and .proc.pid is argv's process. The process
    leads its own process group, so a throttle or a stop reaches any children it starts.
    env holds variables added to this process' environment. Output goes to log_path (appended) if
    given, else to stdout (default: inherited). The proxies are handed over: stop() ends them.
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share}")
    if method is not None and method not in METHODS:
        raise ValueError(f"unknown method {method!r}, expected one of {METHODS}")
    tag = f"{name}-{uuid.uuid4().hex[:8]}"
    cgroup = None
    if share >= 1.0 or method == "none":
        chosen = "none"
    else:
        chosen = "duty-cycle"
        if method in (None, "cgroup-v1"):
            cgroup = _make_cgroup_v1(tag, share)
            chosen = "cgroup-v1" if cgroup else chosen
        if cgroup is None and method in (None, "cgroup-v2"):
            cgroup = _make_cgroup_v2(tag, share)
            chosen = "cgroup-v2" if cgroup else chosen
        if method in ("cgroup-v1", "cgroup-v2") and cgroup is None:
            raise RuntimeError(f"{method} CPU quota is not available on this machine")
    command = list(argv)
    if cgroup is not None:
        command = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *argv]
    log_file = None
    try:
        if log_path is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            log_file = open(log_path, "a")  # noqa: SIM115 - closed by stop()
        out = log_file if log_file is not None else stdout
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    except BaseException:
        if log_file is not None:
            log_file.close()
        if cgroup is not None:
            _remove_cgroup(cgroup, timeout=0.0)
        for proxy in proxies or []:
            proxy.stop()
        raise
    throttle = None
    if chosen == "duty-cycle":
        throttle = _DutyCycle(proc, share)
        throttle.start()
    log.info("started %s (pid %d) at %.0f %% of a core by %s", name, proc.pid, share * 100, chosen)
    return DeviceProcess(proc, chosen, share, cgroup, list(proxies or []), throttle, log_file)
