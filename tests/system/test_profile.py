"""The measured hardware profile sees an emulated slow device: real CPU quota, real delayed sockets."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from fedspeech.edge_client.profile import cgroup_dirs, measure_cpu_gflops, measure_profile, measure_rtt_ms
from fedspeech_bench.fleets.cpu_limits import ONE_THREAD, run_limited
from fedspeech_bench.fleets.fleet_files import DeviceSpec
from fedspeech_bench.fleets.launch import proxied_urls

# processes held to a share of a core, their speed measured: with nothing else running beside them
pytestmark = pytest.mark.alone

# What a device measures, run as its own process: CPU_i from the fixed benchmark, then T_i from a
# short real local training of the CNN on 40 FSDD clips with one torch thread (after a warm-up step,
# as the daemon reports T from its previous round).
MEASURE_DEVICE = textwrap.dedent(
    """
    import json
    import torch
    from fedspeech.edge_client.profile import measure_cpu_gflops
    from fedspeech.models import build_model
    from fedspeech.models.clips.datasets import client_clips, default_spec, load_corpus, load_waveforms
    from fedspeech.models.train import train_local

    torch.set_num_threads(1)
    corpus = load_corpus("fsdd")
    spec = default_spec(corpus)
    train, _ = client_clips(corpus, "jackson")
    waveforms, labels = load_waveforms(train[:40], spec.sample_rate, spec.num_samples)
    model = build_model(spec)
    train_local(model, waveforms[:8], labels[:8], epochs=1, batch_size=8, learning_rate=1e-3)
    gflops = measure_cpu_gflops()
    result = train_local(model, waveforms, labels, epochs=2, batch_size=8, learning_rate=1e-3)
    print(json.dumps({"gflops": gflops, "seconds_per_sample": result.seconds_per_sample}))
    """
)


def run_measurement(share: float, code: str) -> tuple[dict, str]:
    """Run `python -c code` under the fleet launcher at `share` of a core; its last line of JSON."""
    device = run_limited(
        share,
        [sys.executable, "-c", code],
        name="profile-test",
        env={**os.environ, **ONE_THREAD},
        stdout=subprocess.PIPE,
    )
    try:
        out, _ = device.proc.communicate(timeout=120)
    finally:
        device.stop()
    text = out.decode(errors="replace")
    assert device.proc.returncode == 0, text
    return json.loads(text.strip().splitlines()[-1]), device.method


def test_cpu_quota_shows_in_measured_gflops_and_seconds_per_sample():
    full, full_method = run_measurement(1.0, MEASURE_DEVICE)
    slow, slow_method = run_measurement(0.25, MEASURE_DEVICE)
    assert full_method == "none"
    assert slow_method in ("cgroup-v1", "cgroup-v2", "duty-cycle")
    gflops_ratio = full["gflops"] / slow["gflops"]
    t_ratio = slow["seconds_per_sample"] / full["seconds_per_sample"]
    print(f"25 % of a core by {slow_method}: gflops {gflops_ratio:.2f}x lower, T {t_ratio:.2f}x higher")
    assert gflops_ratio >= 2.5, (full, slow)
    assert t_ratio >= 2.5, (full, slow)


class _StatusHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"ok": true}' if self.path == "/api/status" else b"{}"
        self.send_response(200 if self.path == "/api/status" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def status_server() -> Iterator[str]:
    """A tiny real HTTP server on 127.0.0.1 answering /api/status."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StatusHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


MEASURE_RTT = "import json, sys; from fedspeech.edge_client.profile import measure_rtt_ms; "
MEASURE_RTT += "print(json.dumps({'rtt_ms': measure_rtt_ms(sys.argv[1])}))"


def test_round_trip_through_delay_proxy_is_measured(status_server, mosquitto_url):
    direct = measure_rtt_ms(status_server)
    assert direct is not None and direct < 20.0
    spec = DeviceSpec("far", "jackson", cpu_share=1.0, delay_ms=100.0)
    coordinator_url, _, proxies = proxied_urls(spec, status_server, mosquitto_url)
    try:
        assert coordinator_url != status_server
        # measured by a device process of its own, which is only given the proxy's URL
        device = run_limited(
            1.0, [sys.executable, "-c", MEASURE_RTT, coordinator_url], name="rtt-test", stdout=subprocess.PIPE
        )
        out, _ = device.proc.communicate(timeout=60)
        device.stop()
    finally:
        for proxy in proxies:
            proxy.stop()
    rtt = json.loads(out.decode().strip().splitlines()[-1])["rtt_ms"]
    print(f"L direct {direct:.1f} ms, through a 100 ms proxy {rtt:.1f} ms")
    assert rtt == pytest.approx(100.0, rel=0.2)


def test_unreachable_coordinator_has_no_round_trip():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        assert measure_rtt_ms(f"http://127.0.0.1:{port}", timeout=2) is None


def _memory_limit_mb() -> float | None:
    """The tightest memory limit (cgroup v1 or v2) over this process' cgroups, read here, or None."""
    limits = []
    for controller, limit_file in (("memory", "memory.limit_in_bytes"), ("", "memory.max")):
        for directory in cgroup_dirs(controller):
            path = directory / limit_file
            text = path.read_text().strip() if path.exists() else ""
            if text.isdigit() and int(text) < 2**60:  # "max" (v2) or about 2^63 (v1): no limit
                limits.append(int(text) / 2**20)
    return min(limits) if limits else None


def test_profile_cores_ram_and_clock_agree_with_psutil_and_the_cgroup():
    before = psutil.virtual_memory().available / 2**20
    profile = measure_profile()
    after = psutil.virtual_memory().available / 2**20
    assert profile.cpu_count == (psutil.cpu_count() or os.cpu_count())
    limit = _memory_limit_mb()
    print(f"RAM: profile {profile.ram_available_mb:.0f} MB, psutil {before:.0f}-{after:.0f}, limit {limit}")
    # other processes allocate meanwhile: allow 5 % of drift between the three readings
    assert profile.ram_available_mb <= max(before, after) * 1.05
    if limit is None:
        assert profile.ram_available_mb >= min(before, after) * 0.95
    else:
        assert 0 < profile.ram_available_mb <= limit
    freq = psutil.cpu_freq()
    if freq is None or not freq.current:
        assert profile.cpu_freq_mhz == 0.0  # no cpufreq here: reported as unknown, not made up
    else:
        assert 100 <= profile.cpu_freq_mhz <= 10_000  # MHz, of any CPU from a Pi Zero to a desktop


def test_measured_gflops_are_plausible_and_repeatable():
    first, second = measure_cpu_gflops(), measure_cpu_gflops()
    profile = measure_profile()
    print(f"GFLOP/s: {first:.2f}, {second:.2f}, in the profile {profile.cpu_gflops:.2f}")
    # one core doing float32 matrix products: a Pi 3 does about 1, a desktop core a few hundred
    for gflops in (first, second, profile.cpu_gflops):
        assert 0.1 <= gflops <= 2_000
    # the same work twice a moment apart: within a factor of 2 even on a machine others share
    assert 0.5 <= first / second <= 2.0
    assert 0.5 <= profile.cpu_gflops / first <= 2.0


def _memory_cgroup(limit_mb: int) -> Path | None:
    dirs = cgroup_dirs("memory")
    if not dirs or not (dirs[0] / "memory.limit_in_bytes").exists():
        return None
    path = dirs[0] / f"fedspeech-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
        (path / "memory.limit_in_bytes").write_text(str(limit_mb * 2**20))
    except OSError:
        if path.exists():
            path.rmdir()
        return None
    return path


JOIN_CGROUP = 'echo $$ > "$0" && exec "$@"'  # sh puts itself in the cgroup, then becomes the command


def test_profile_ram_counts_a_cgroup_memory_limit():
    path = _memory_cgroup(300)
    if path is None:
        pytest.skip("no writable cgroup v1 memory controller here")
    code = "from fedspeech.edge_client.profile import measure_profile as m; print(m().ram_available_mb)"
    try:
        out = subprocess.run(
            ["sh", "-c", JOIN_CGROUP, str(path / "cgroup.procs"), sys.executable, "-c", code],
            capture_output=True,
            timeout=60,
            check=True,
        ).stdout
    finally:
        path.rmdir()
    ram = float(out.decode().strip().splitlines()[-1])
    print(f"available RAM in the profile under a 300 MB cgroup limit: {ram:.0f} MB")
    # the limit less what the process itself uses (an interpreter with numpy: tens of MB, not 150)
    assert 150 < ram <= 300
