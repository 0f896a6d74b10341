"""The emulated fleet: fleet files, the delaying proxy on real sockets, and CPU limits on real processes."""

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from fedspeech.models.clips.datasets import load_corpus, speakers
from fedspeech.models.clips.tasks import BUILTIN_TASKS, spec_for
from fedspeech.protocol import messages
from fedspeech.protocol.messages import TaskInfo
from fedspeech.protocol.topics import parse_broker_url
from fedspeech_bench.fleets.cpu_limits import ONE_THREAD, run_limited
from fedspeech_bench.fleets.fleet_files import (
    FLEETS_DIR,
    DeviceSpec,
    check_fleet,
    fleet_path,
    hosted_fleet,
    load_fleet,
    machine_cores,
    shipped_fleets,
)
from fedspeech_bench.fleets.launch import launch_fleet, stop_fleet
from fedspeech_bench.fleets.network_proxy import DelayProxy

FLEETS = Path(__file__).resolve().parents[2] / "bench" / "fedspeech_bench" / "fleets"
EMODB_SPEAKERS = {"03", "08", "09", "10", "11", "12", "13", "14", "15", "16"}

# processes held to a share of a core, their speed measured: with nothing else running beside them
pytestmark = pytest.mark.alone


# ---- fleet files ----


@pytest.mark.parametrize(
    ("name", "size"), [("pi-mix", 6), ("pi-mix-10", 10), ("pi4-wifi", 6), ("pi5-pi4", 6)]
)
def test_shipped_fleets_load_and_fit_two_cores(name, size):
    fleet = load_fleet(FLEETS / f"{name}.toml")
    assert len(fleet) == size
    assert len({spec.name for spec in fleet}) == size
    assert sum(spec.cpu_share for spec in fleet) < 2
    check_fleet(fleet, cores=2)
    if machine_cores() >= 2:
        check_fleet(fleet)
    devices = {spec.speaker for spec in fleet}
    assert devices == (set(speakers(load_corpus("fsdd"))) if size == 6 else EMODB_SPEAKERS)
    shares = sorted({spec.cpu_share for spec in fleet}, reverse=True)
    steps = [round(a / b, 2) for a, b in zip(shares, shares[1:], strict=False)]
    classes = {"pi4-wifi": [], "pi5-pi4": [2.5]}  # Pi 5 : Pi 4 (: Pi 3)
    assert steps == classes.get(name, [2.5, 2.5])


def test_a_fleet_is_a_file_or_a_shipped_fleets_name(tmp_path, monkeypatch):
    assert {"pi-mix", "pi-mix-10", "pi4-wifi"} <= set(shipped_fleets())
    assert fleet_path("pi-mix") == FLEETS_DIR / "pi-mix.toml"
    assert load_fleet(fleet_path("pi-mix")) == load_fleet(FLEETS / "pi-mix.toml")
    own = tmp_path / "mine.toml"
    own.write_text((FLEETS / "pi-mix.toml").read_text())
    assert fleet_path(own) == own and fleet_path(str(own)) == own
    assert fleet_path("no-such-fleet") == Path("no-such-fleet")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pi-mix").write_text("")  # a file of that name in the working directory comes first
    assert fleet_path("pi-mix") == Path("pi-mix")


def test_hosted_fleet_spreads_speakers_round_robin():
    fleet = hosted_fleet([f"s{i}" for i in range(7)], hosts=3, cpu_share=0.25)
    assert [d.device_ids for d in fleet] == [["s0", "s3", "s6"], ["s1", "s4"], ["s2", "s5"]]
    assert [d.name for d in fleet] == ["host-1", "host-2", "host-3"] and {d.cpu_share for d in fleet} == {
        0.25
    }
    assert len(hosted_fleet(["a", "b"], hosts=5, cpu_share=0.1)) == 2, "no empty hosts"
    check_fleet(fleet, cores=2)


def test_check_fleet_refuses_shares_reaching_the_cores_or_above_one_core():
    half = [DeviceSpec(f"d{i}", "jackson", 0.5) for i in range(4)]
    check_fleet(half[:3], cores=2)
    with pytest.raises(ValueError, match="add up to 2.00 cores"):
        check_fleet(half, cores=2)
    with pytest.raises(ValueError, match="cpu_share"):
        check_fleet([DeviceSpec("big", "jackson", 1.5)], cores=8)
    with pytest.raises(ValueError, match="cpu_share"):
        check_fleet([DeviceSpec("none", "jackson", 0.0)], cores=8)
    with pytest.raises(ValueError, match="no devices"):
        check_fleet([], cores=2)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[[device]\nname = 'x'", "not valid TOML"),
        ("", "no \\[\\[device\\]\\] tables"),
        ("[[device]]\nname = 'a'\nspeaker = 'b'\ncpu_share = 0.5\ncores = 2", "unknown setting"),
        ("[[device]]\nname = 'a'\ncpu_share = 0.5", "missing \\['speaker'\\]"),
        ("[[device]]\nname = 'a'\nspeaker = 'b'\ncpu_share = true", "must be a number"),
        ("[[device]]\nname = 'a'\nspeaker = 'b'\ncpu_share = 2", "device 1: cpu_share"),
        ("[[device]]\nname = 'a'\nspeaker = 'b'\ncpu_share = 0.5\ndelay_ms = -1", "delay_ms"),
        ("[[device]]\nname='a'\nspeaker='b'\ncpu_share=0.1\n" * 2, "unique"),
    ],
)  # fmt: skip
def test_load_fleet_says_what_is_wrong(tmp_path, text, error):
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        load_fleet(path)


# ---- the delaying proxy ----


def test_proxy_carries_an_mqtt_session(mosquitto_url):
    host, port = parse_broker_url(mosquitto_url)
    topic = f"fedspeech-test/{uuid.uuid4().hex[:12]}/proxied"
    received: queue.Queue[bytes] = queue.Queue()
    subscribed = threading.Event()
    with DelayProxy(host, port, delay_ms=40) as proxy:
        through = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        through.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        through.on_subscribe = lambda *_: subscribed.set()
        through.on_message = lambda c, u, msg: received.put(msg.payload)
        through.connect("127.0.0.1", proxy.port)
        through.loop_start()
        direct = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        direct.connect(host, port)
        direct.loop_start()
        try:
            assert subscribed.wait(10), "no SUBACK through the proxy"
            direct.publish(topic, b"hello through the proxy", qos=1).wait_for_publish(5)
            assert received.get(timeout=10) == b"hello through the proxy"
        finally:
            for client in (through, direct):
                client.disconnect()
                client.loop_stop()


class _Handler(BaseHTTPRequestHandler):
    body = os.urandom(1 << 20)

    def do_GET(self) -> None:
        if self.path == "/big":
            body = self.body
        elif self.path == "/api/task":  # what a starting device asks first
            fsdd = BUILTIN_TASKS["fsdd"]
            body = messages.encode(TaskInfo(fsdd, spec_for(fsdd)))
        else:
            body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts.put((self.path, data))
        self.send_response(503)  # keeps a registering device retrying, so it stays up
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[ThreadingHTTPServer]:
    """A real HTTP server on 127.0.0.1: /api/task, /api/status, a 1 MiB /big, and POSTs recorded in .posts."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.posts = queue.Queue()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_proxy_carries_http_intact(http_server):
    with DelayProxy("127.0.0.1", http_server.server_port, delay_ms=10, bandwidth_kbps=200_000) as proxy:
        base = f"http://127.0.0.1:{proxy.port}"
        with urllib.request.urlopen(f"{base}/api/status", timeout=10) as reply:
            assert json.loads(reply.read()) == {"ok": True}
        with urllib.request.urlopen(f"{base}/big", timeout=30) as reply:
            assert reply.read() == _Handler.body  # every byte, in order


def test_proxy_paces_bandwidth():
    received = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    size = 200_000

    def sink() -> None:
        conn, _ = listener.accept()
        with conn:
            total = 0
            while total < size and (chunk := conn.recv(65536)):
                total += len(chunk)
        if total == size:
            received.set()

    thread = threading.Thread(target=sink, daemon=True)
    thread.start()
    with DelayProxy("127.0.0.1", listener.getsockname()[1], bandwidth_kbps=800) as proxy:
        conn = socket.create_connection(("127.0.0.1", proxy.port))
        start = time.monotonic()
        conn.sendall(os.urandom(size))
        assert received.wait(30)
        elapsed = time.monotonic() - start
        conn.close()
    listener.close()
    print(f"200 kB through an 800 kbit/s proxy: {elapsed:.2f} s")
    assert elapsed >= 1.5


def test_proxy_stop_closes_the_port():
    proxy = DelayProxy("127.0.0.1", 9, delay_ms=5).start()
    port = proxy.port
    proxy.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


# ---- CPU limits ----

GFLOPS = "import json; from fedspeech.edge_client.profile import measure_cpu_gflops as m; "
GFLOPS += "print(json.dumps(m(0.3)))"


def _gflops(share: float, method: str | None = None) -> tuple[float, str]:
    device = run_limited(
        share,
        [sys.executable, "-c", GFLOPS],
        env={**os.environ, **ONE_THREAD},
        method=method,
        stdout=subprocess.PIPE,
    )
    try:
        out, _ = device.proc.communicate(timeout=60)
    finally:
        device.stop()
    assert device.proc.returncode == 0, out
    return float(out.decode().strip().splitlines()[-1]), device.method


def test_duty_cycle_throttle_slows_a_process():
    full, full_method = _gflops(1.0)
    slow, slow_method = _gflops(0.25, method="duty-cycle")
    assert (full_method, slow_method) == ("none", "duty-cycle")
    print(f"duty-cycle at 25 %: {full:.1f} -> {slow:.1f} GFLOP/s ({full / slow:.2f}x)")
    assert full / slow >= 2.0


def _proc_text(pid: int, name: str) -> str:
    return Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b"\n").decode(errors="replace")


def test_launched_daemon_is_slower_and_further_away(http_server, mosquitto_url, tmp_path):
    """Two real device daemons register with a stub coordinator: the measured profiles show the limits."""
    if machine_cores() < 2:
        pytest.skip("a full-core device and a quarter-core device need two cores")
    near = DeviceSpec("near", "jackson", cpu_share=1.0)
    far = DeviceSpec("far", "nicolas", cpu_share=0.25, delay_ms=100.0, bandwidth_kbps=5000)
    coordinator = f"http://127.0.0.1:{http_server.server_port}"
    devices, profiles = {}, {}
    try:
        state = ["--state", str(tmp_path / "devices")]
        started = launch_fleet([near, far], coordinator, mosquitto_url, "fsdd", None, tmp_path, state)
        devices = {spec.name: device for spec, device in zip([near, far], started, strict=True)}
        assert (len(devices["near"].proxies), len(devices["far"].proxies)) == (0, 2)
        while len(profiles) < 2:
            path, body = http_server.posts.get(timeout=60)
            registration = json.loads(body)
            assert path == "/api/devices"
            profiles[registration["device_id"]] = registration["profile"]
        slow = devices["far"]
        assert devices["near"].method == "none"
        assert slow.method in ("cgroup-v1", "cgroup-v2", "duty-cycle")
        pid = slow.proc.pid
        assert "--threads\n1\n" in _proc_text(pid, "cmdline")
        assert "OMP_NUM_THREADS=1\n" in _proc_text(pid, "environ")
        if slow.cgroup is not None:
            assert str(pid) in (slow.cgroup / "cgroup.procs").read_text().split()
    finally:
        cgroup = devices["far"].cgroup if "far" in devices else None
        proxy_ports = [proxy.port for proxy in devices["far"].proxies] if "far" in devices else []
        stop_fleet(list(devices.values()))
    print(f"near {profiles['near']}\nfar  {profiles['far']}")
    assert profiles["near"]["cpu_gflops"] / profiles["far"]["cpu_gflops"] >= 2.0
    assert profiles["far"]["rtt_ms"] >= 80.0
    assert profiles["near"]["rtt_ms"] < 40.0
    assert cgroup is None or not cgroup.exists()
    for port in proxy_ports:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
