"""What a device measures about itself: compute throughput, cores, clock, free memory, round-trip.

Everything here is measured on the device as it runs now; nothing is read from configuration, so an
emulated slow device (CPU quota, duty-cycle throttle, delaying proxy) shows up only through its effect.
numpy and psutil only: importing this module must stay light (no torch).
"""

import http.client
import logging
import os
import ssl
import statistics
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import psutil

from fedspeech.protocol import routes
from fedspeech.protocol.messages import Profile

log = logging.getLogger(__name__)

_MAX_STATUS_BYTES = 64 * 1024  # of the status reply read: its time is what counts, not its content

# The benchmark: a stack of float32 64x64 matrix products. 64^3 multiply-adds is below OpenBLAS' (and
# MKL's) threshold for splitting one GEMM across threads, so each product runs on the calling thread
# whatever the BLAS thread setting: the figure is this process' single-core throughput, and two
# processes measuring at once on two cores do not halve each other.
_BENCH_SIZE = 64
_BENCH_BATCH = 16
_FLOP_PER_CALL = 2 * _BENCH_SIZE**3 * _BENCH_BATCH

# a cgroup memory limit at or above this is the kernel's "no limit" (v1 writes 2^63 rounded to a page)
_UNLIMITED_BYTES = 2**60


def measure_cpu_gflops(duration_s: float = 0.2) -> float:
    """GFLOP/s of single-threaded float32 matrix products over about duration_s of wall time.

    Throughput is work done over elapsed wall time, so time the process spends throttled (CPU quota,
    stopped by a duty-cycle throttle, preempted by other load) lowers the figure, as it should.
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((_BENCH_BATCH, _BENCH_SIZE, _BENCH_SIZE), dtype=np.float32)
    b = rng.standard_normal((_BENCH_BATCH, _BENCH_SIZE, _BENCH_SIZE), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, b, out=out)  # warm-up: page in the buffers and the BLAS kernel
    calls = 0
    start = time.perf_counter()
    deadline = start + max(duration_s, 0.01)
    while True:
        np.matmul(a, b, out=out)
        calls += 1
        now = time.perf_counter()
        if now >= deadline:
            break
    return calls * _FLOP_PER_CALL / (now - start) / 1e9


def _cpu_freq_mhz() -> float:
    try:
        freq = psutil.cpu_freq()
    except (NotImplementedError, OSError):  # some containers and ARM boards expose no cpufreq
        return 0.0
    return float(freq.current) if freq and freq.current else 0.0


def cgroup_dirs(controller: str) -> list[Path]:
    """This process' cgroup directory for a v1 controller (or v2 if controller is ''), then its ancestors.

    Mapped through /proc/self/mountinfo, so a container that mounts its own sub-tree still resolves.
    """
    try:
        own = None
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            names = controllers.split(",")
            if names == [controller] or (controller and controller in names):  # "" is the v2 line
                own = path
                break
        if own is None:
            return []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            fstype, options = tail[0], tail[2].split(",") if len(tail) > 2 else []
            if controller == "" and fstype != "cgroup2":
                continue
            if controller and (fstype != "cgroup" or controller not in options):
                continue
            root, mount = fields[3], Path(fields[4])
            if root != "/" and not (own == root or own.startswith(root.rstrip("/") + "/")):
                continue
            relative = own[len(root) :] if root != "/" else own
            leaf = mount / relative.lstrip("/")
            dirs = [leaf, *leaf.parents]
            return [d for d in dirs if d == mount or mount in d.parents]
    except (OSError, ValueError, IndexError):
        pass
    return []


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # v2 writes "max" for no limit


def _cgroup_headroom_bytes() -> float | None:
    """The tightest (limit - usage) over this process' memory cgroup and its ancestors, if any is set."""
    headrooms = []
    # v1 memory controller, then v2 (unified); a limit on an ancestor bounds its whole sub-tree
    for controller, limit_file, usage_file in (
        ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
        ("", "memory.max", "memory.current"),
    ):
        for directory in cgroup_dirs(controller):
            limit, usage = _read_int(directory / limit_file), _read_int(directory / usage_file)
            if limit is not None and usage is not None and limit < _UNLIMITED_BYTES:
                headrooms.append(float(limit - usage))
    return min(headrooms) if headrooms else None


def available_ram_mb() -> float:
    """MiB of memory this process could still get: psutil's available, capped by a cgroup limit."""
    available = float(psutil.virtual_memory().available)
    headroom = _cgroup_headroom_bytes()
    if headroom is not None:
        available = min(available, max(headroom, 0.0))
    return available / 2**20


def measure_profile(last_seconds_per_sample: float | None = None, rtt_ms: float | None = None) -> Profile:
    """Measure this device's hardware now, adding the last training speed and round-trip if known."""
    return Profile(
        cpu_count=psutil.cpu_count() or os.cpu_count() or 1,
        cpu_freq_mhz=_cpu_freq_mhz(),
        ram_available_mb=available_ram_mb(),
        cpu_gflops=measure_cpu_gflops(),
        seconds_per_sample=last_seconds_per_sample,
        rtt_ms=rtt_ms,
    )


def _get_status_ms(url: str, timeout: float, context: ssl.SSLContext | None) -> float | None:
    start = time.perf_counter()
    try:
        status_url = routes.url(url, routes.STATUS)
        with urllib.request.urlopen(status_url, timeout=timeout, context=context) as response:
            response.read(_MAX_STATUS_BYTES)
    except urllib.error.HTTPError as exc:
        exc.close()  # any HTTP answer is a completed round-trip
    except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: not a coordinator's URL
        log.debug("round-trip to %s failed: %s", url, exc)
        return None
    return (time.perf_counter() - start) * 1000.0


def measure_rtt_ms(
    url: str, timeout: float = 5.0, attempts: int = 3, context: ssl.SSLContext | None = None
) -> float | None:
    """Median milliseconds of a few GETs of {url}/api/status, or None if the coordinator cannot be reached.

    context: TLS settings of an HTTPS coordinator whose certificate a private CA signed.
    """
    samples = []
    for _ in range(max(1, attempts)):
        elapsed = _get_status_ms(url, timeout, context)
        if elapsed is None:
            break  # unreachable: one timeout is enough, do not wait for three
        samples.append(elapsed)
    return statistics.median(samples) if samples else None
