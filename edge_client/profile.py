"""What a device measures about itself: cores, clock, free memory, round-trip to the coordinator."""

import http.client
import logging
import os
import time
import urllib.error
import urllib.request

import psutil

from fedspeech.protocol.messages import Profile

log = logging.getLogger(__name__)


def _cpu_freq_mhz() -> float:
    try:
        freq = psutil.cpu_freq()
    except (NotImplementedError, OSError):  # some containers and ARM boards expose no cpufreq
        return 0.0
    return float(freq.current) if freq and freq.current else 0.0


def measure_profile(last_seconds_per_sample: float | None = None, rtt_ms: float | None = None) -> Profile:
    """Measure this device's hardware now, adding the last training speed and round-trip if known."""
    return Profile(
        cpu_count=psutil.cpu_count() or os.cpu_count() or 1,
        cpu_freq_mhz=_cpu_freq_mhz(),
        ram_available_mb=psutil.virtual_memory().available / 2**20,
        seconds_per_sample=last_seconds_per_sample,
        rtt_ms=rtt_ms,
    )


def measure_rtt_ms(url: str, timeout: float = 5.0) -> float | None:
    """Milliseconds for a GET of {url}/api/status, or None if the coordinator cannot be reached."""
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/status", timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        exc.close()  # any HTTP answer is a completed round-trip
    except (OSError, http.client.HTTPException) as exc:
        log.debug("round-trip to %s failed: %s", url, exc)
        return None
    return (time.perf_counter() - start) * 1000.0
