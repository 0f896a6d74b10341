"""An emulated heterogeneous fleet on one machine: each device process is made really slower.

A fleet file (TOML) lists devices with the fraction of one core each may use and the network in front
of it. `start_device` runs the device daemon under a CPU quota (cgroup v1 cpu.cfs_quota_us, or cgroup v2
cpu.max, where writable) or, failing both, under a duty-cycle throttle that stops and continues the
process; `proxied_urls` puts a DelayProxy in front of the coordinator and the broker. The device is
never told any of this: it measures its own speed and round-trip (edge_client/profile.py).
"""

import contextlib
import importlib.resources
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

from fedspeech.edge_client.profile import cgroup_dirs
from fedspeech.network_proxy import DelayProxy

log = logging.getLogger(__name__)

# A CFS period shorter than the kernel's default 100 ms: the quota comes in small slices, so a slow
# device is never frozen for long stretches (at 8 % of a core and 100 ms it would run 8 ms, then stall
# 92 ms, holding up its MQTT keep-alives and replies) and a short measurement sees the average share.
# Raised where the quota would fall under the kernel's 1 ms minimum.
FLEETS_DIR = Path(str(importlib.resources.files("fedspeech.fleets")))
DEFAULT_FLEETS = {"fsdd": FLEETS_DIR / "pi-mix.toml", "emodb": FLEETS_DIR / "pi-mix-10.toml"}
CFS_PERIOD_US = 20_000
_MIN_QUOTA_US = 1_000
DUTY_CYCLE_S = 0.02  # the duty-cycle throttle's period: run share * 20 ms, stop the rest
_MIN_RUN_S = 0.002
CGROUP_GROUP = "fedspeech"  # our cgroups live in <own cgroup>/fedspeech/<device>-<random>/
METHODS = ("cgroup-v1", "cgroup-v2", "duty-cycle", "none")
# a device's share is of one core: keep OpenMP, OpenBLAS and MKL pools to one thread
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class DeviceSpec:
    """One emulated device: name, whose recordings it trains on, its CPU share and network."""

    name: str
    speaker: str
    cpu_share: float  # fraction of one core, in (0, 1]
    delay_ms: float = 0.0  # added round-trip latency to coordinator and broker
    bandwidth_kbps: float | None = None  # None: not limited
    # set instead of speaker: the process hosts one device per speaker, named by it, all sharing its
    # CPU share and network (a fleet of hundreds does not fit in a process each)
    speakers: tuple[str, ...] = ()

    @property
    def device_ids(self) -> list[str]:
        """The ids of the devices this process runs."""
        return list(self.speakers) or [self.name]


def hosted_fleet(speakers: list[str], hosts: int, cpu_share: float) -> list[DeviceSpec]:
    """Many speaker devices spread round-robin over `hosts` processes of cpu_share each."""
    return [
        DeviceSpec(f"host-{i + 1}", "", cpu_share, speakers=tuple(speakers[i::hosts]))
        for i in range(min(hosts, len(speakers)))
    ]


# ---- fleet files ----

_FIELDS = {"name": str, "speaker": str, "cpu_share": float, "delay_ms": float, "bandwidth_kbps": float}
_REQUIRED = ("name", "speaker", "cpu_share")


def _check_device(spec: DeviceSpec, where: str) -> None:
    if not 0.0 < spec.cpu_share <= 1.0:
        raise ValueError(f"{where}: cpu_share must be in (0, 1] (of one core), got {spec.cpu_share}")
    if spec.delay_ms < 0:
        raise ValueError(f"{where}: delay_ms must not be negative, got {spec.delay_ms}")
    if spec.bandwidth_kbps is not None and spec.bandwidth_kbps <= 0:
        raise ValueError(f"{where}: bandwidth_kbps must be positive, got {spec.bandwidth_kbps}")


def _device_from_table(table: object, where: str) -> DeviceSpec:
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table of device settings")
    unknown = sorted(set(table) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown}, expected some of {sorted(_FIELDS)}")
    missing = [key for key in _REQUIRED if key not in table]
    if missing:
        raise ValueError(f"{where}: missing {missing}")
    values = {}
    for key, value in table.items():
        if _FIELDS[key] is str:
            if not isinstance(value, str) or not value:
                raise ValueError(f"{where}: {key} must be a non-empty string, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: {key} must be a number, got {value!r}")
        values[key] = value if _FIELDS[key] is str else float(value)
    spec = DeviceSpec(**values)
    _check_device(spec, where)
    return spec


def load_fleet(path: str | Path) -> list[DeviceSpec]:
    """Read a fleet file: a list of [[device]] tables. ValueError says which device and setting is wrong."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    other = sorted(set(document) - {"device"})
    if other:
        raise ValueError(f"{path}: unknown top-level key(s) {other}; devices go in [[device]] tables")
    tables = document.get("device")
    if not isinstance(tables, list) or not tables:
        raise ValueError(f"{path}: no [[device]] tables")
    fleet = [_device_from_table(table, f"{path}: device {i + 1}") for i, table in enumerate(tables)]
    names = [spec.name for spec in fleet]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"{path}: device names must be unique, repeated: {duplicates}")
    return fleet


def machine_cores() -> int:
    """Cores this process may run on (its affinity mask, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_fleet(fleet: list[DeviceSpec], cores: int | None = None) -> None:
    """ValueError unless every share is in (0, 1] and together they stay below the machine's cores.

    The devices must never slow each other down: a device's measured speed has to come from its own
    quota, not from competing with the others (or with the coordinator) for a saturated machine.
    """
    if not fleet:
        raise ValueError("the fleet has no devices")
    for spec in fleet:
        _check_device(spec, f"device {spec.name!r}")
    cores = machine_cores() if cores is None else cores
    total = sum(spec.cpu_share for spec in fleet)
    if total >= cores:
        raise ValueError(
            f"the devices' CPU shares add up to {total:.2f} cores but this machine has {cores}: "
            "they would slow each other down; lower the shares or run fewer devices"
        )


# ---- network ----


def _proxy_url(url: str, proxy: DelayProxy) -> str:
    parts = urlsplit(url)
    netloc = f"127.0.0.1:{proxy.port}"
    if parts.username:
        credentials = parts.username + (f":{parts.password}" if parts.password else "")
        netloc = f"{credentials}@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _upstream(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"no host in URL {url!r}")
    return parts.hostname, parts.port or default_port


def proxied_urls(
    spec: DeviceSpec, coordinator_url: str, broker_url: str
) -> tuple[str, str, list[DelayProxy]]:
    """(coordinator URL, broker URL, started proxies) as the device should use them.

    With no delay and no bandwidth limit the URLs come back unchanged and no proxy is started.
    Otherwise one DelayProxy per upstream (HTTP and MQTT) adds spec.delay_ms of round-trip and paces
    to spec.bandwidth_kbps; stop them (DeviceProcess.stop does) when the device is done.
    """
    if spec.delay_ms <= 0 and spec.bandwidth_kbps is None:
        return coordinator_url, broker_url, []
    http_default = 443 if urlsplit(coordinator_url).scheme == "https" else 80
    proxies: list[DelayProxy] = []
    try:
        urls = []
        for url, default_port in ((coordinator_url, http_default), (broker_url, 1883)):
            proxy = DelayProxy(*_upstream(url, default_port), spec.delay_ms, spec.bandwidth_kbps).start()
            proxies.append(proxy)
            urls.append(_proxy_url(url, proxy))
    except BaseException:
        for proxy in proxies:
            proxy.stop()
        raise
    return urls[0], urls[1], proxies


# ---- CPU limits ----


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

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait, SIGKILL if needed; then remove the cgroup, stop the throttle and the proxies."""
        if self._throttle is not None:
            self._throttle.stop()  # leaves the process continued, so it can handle SIGTERM
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGTERM)
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


def start_device(
    spec: DeviceSpec,
    args: list[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    *,
    proxies: list[DelayProxy] | None = None,
    method: str | None = None,
) -> DeviceProcess:
    """Run `python -m fedspeech client ARGS --threads 1` as spec's device, CPU-limited to its share.

    args carry the coordinator and broker URLs (through proxied_urls' proxies when the spec has a
    delay or bandwidth; pass those proxies here so stop() ends them too), the speaker and the rest.
    One thread for torch and for BLAS (OMP_NUM_THREADS=1): the share is of one core. env holds
    variables added to this process' environment.
    """
    argv = [sys.executable, "-m", "fedspeech", "client", *args]
    if "--threads" not in args:
        argv += ["--threads", "1"]
    child_env = {**(env or {}), **ONE_THREAD, "PYTHONUNBUFFERED": "1"}
    return run_limited(
        spec.cpu_share, argv, name=spec.name, log_path=log_path, env=child_env, method=method, proxies=proxies
    )


def launch_fleet(
    fleet: list[DeviceSpec],
    coordinator_url: str,
    broker_url: str,
    corpus: str,
    data_dir: Path | None,
    log_dir: Path,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> list[DeviceProcess]:
    """One device daemon per spec behind its own proxies, logged to LOG_DIR/NAME.log.

    Each device runs `fedspeech client --corpus C [--data-dir D] --speaker S --device-id NAME` plus
    extra_args (topic root, max samples, ...). If one fails to start, those already started are stopped.
    Callers that compare timings run check_fleet first.
    """
    devices: list[DeviceProcess] = []
    try:
        for spec in fleet:
            coordinator, broker, proxies = proxied_urls(spec, coordinator_url, broker_url)
            args = ["--corpus", corpus]
            if spec.speakers:
                args += [arg for speaker in spec.speakers for arg in ("--speaker", speaker)]
            else:
                args += ["--speaker", spec.speaker, "--device-id", spec.name]
            args += ["--data-dir", str(data_dir)] if data_dir is not None else []
            args += ["--coordinator", coordinator, "--broker", broker, *(extra_args or [])]
            devices.append(start_device(spec, args, Path(log_dir) / f"{spec.name}.log", env, proxies=proxies))
    except BaseException:
        stop_fleet(devices)
        raise
    return devices


def stop_fleet(devices: list[DeviceProcess], timeout: float = 20.0) -> None:
    """SIGTERM every device at once, then stop each (wait, kill, clean up)."""
    for device in devices:
        if device._throttle is not None:
            device._throttle.stop()
        if device.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(device.proc.pid, signal.SIGTERM)
    for device in devices:
        device.stop(timeout)
