"""A live deployment to attack: a coordinator process with closed enrolment and an admin token, and enrolled
device daemons, each a process of its own, on the coordinator's embedded (anonymous) broker.

The coordinator is a process of its own so that its memory is measured alone; its resident set is sampled
while the fleet runs, and so is how long an honest `GET /api/status` takes to be answered.
"""

import json
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from fedspeech.protocol.topics import Topics
from fedspeech_bench.fleet_run import free_port
from fedspeech_bench.fleets.cpu_limits import DeviceProcess
from fedspeech_bench.fleets.fleet_files import DeviceSpec
from fedspeech_bench.fleets.launch import launch_fleet, stop_fleet

MiB = 1024 * 1024
SAMPLE_S = 0.05  # the coordinator's memory and an honest status, sampled this often


@dataclass(frozen=True)
class FleetSettings:
    """What every arm's deployment runs: rounds, local epochs, how often the devices evaluate, and the
    first round a compromised device attacks in (honest before).
    """

    rounds: int
    epochs: int = 2
    eval_every: int = 3
    round_timeout_s: float = 300.0
    attack_from: int = 1
    secure_aggregation: bool = False


@dataclass
class Watch:
    """What the bench sees of the coordinator while an arm runs: its memory, and an honest client's wait."""

    rss_start: int = 0
    rss_peak: int = 0
    slowest_status_s: float = 0.0
    statuses: int = 0
    failed_statuses: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class LiveFleet:
    """A running deployment: where it is, who is in it, and the secrets an operator holds."""

    run_dir: Path
    url: str
    broker_url: str
    topics: Topics
    coordinator: subprocess.Popen
    admin_token: str
    devices: list[DeviceProcess]
    device_ids: list[str]
    watch: Watch

    @property
    def state(self) -> Path:
        """The coordinator's state folder."""
        return self.run_dir / "state"

    def device_state(self, device_id: str) -> Path:
        """A device's own state folder: its token, its broker passwords and the coordinator's pinned key."""
        return self.run_dir / "devices" / device_id

    def token(self, device_id: str) -> str:
        """A device's bearer token, as its daemon keeps it (empty until it has registered)."""
        path = self.device_state(device_id) / "token"
        return path.read_text().strip() if path.exists() else ""

    def status(self) -> dict:
        """The coordinator's status, as the operator sees it."""
        return get_json(f"{self.url}/api/status", self.admin_token)

    def log(self) -> str:
        """What the coordinator logged so far."""
        return (self.run_dir / "logs" / "coordinator.log").read_text(errors="replace")


def get_json(url: str, token: str | None = None, timeout: float = 10.0) -> dict:
    """GET url as JSON, with a bearer token if one is given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as reply:
        return json.loads(reply.read())


def enrol(state: Path, device_id: str, folder: Path) -> Path:
    """`fedspeech devices add ID --secret-file FILE` as an operator runs it (the first makes the state)."""
    path = folder / f"{device_id}.secret"
    subprocess.run(
        [sys.executable, "-m", "fedspeech", "devices", "add", device_id, "--state", str(state), "--new-state",
         "--secret-file", str(path)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return path


def _watch(fleet: LiveFleet, stop: threading.Event) -> None:
    """Sample the coordinator's resident set and an honest status' answer time until stop is set."""
    process, watch = psutil.Process(fleet.coordinator.pid), fleet.watch
    watch.rss_start = watch.rss_peak = process.memory_info().rss
    next_status = 0.0
    while not stop.wait(SAMPLE_S):
        try:
            watch.rss_peak = max(watch.rss_peak, process.memory_info().rss)
        except psutil.Error:
            return
        if time.monotonic() < next_status:
            continue
        next_status = time.monotonic() + 0.5
        started = time.monotonic()
        try:
            get_json(f"{fleet.url}/api/status", timeout=10)
        except OSError as exc:
            watch.failed_statuses += 1
            watch.errors.append(str(exc))
        watch.statuses += 1
        watch.slowest_status_s = max(watch.slowest_status_s, time.monotonic() - started)


def _coordinator_args(
    run_dir: Path, topics: Topics, settings: FleetSettings, port: int, broker_port: int, devices: int
) -> list[str]:
    return [
        sys.executable, "-m", "fedspeech", "coordinator", "--state", str(run_dir / "state"),
        "--port", str(port), "--broker-port", str(broker_port), "--topic-root", topics.root,
        "--admin-token-file", str(run_dir / "admin.token"),
        "--rounds", str(settings.rounds), "--epochs", str(settings.epochs),
        "--eval-every", str(settings.eval_every), "--round-timeout", str(settings.round_timeout_s),
        "--min-devices", str(devices), "--eval-corpus", "fsdd",
        *(["--secure-aggregation"] if settings.secure_aggregation else []),
    ]  # fmt: skip


def _wait_until_serving(fleet: LiveFleet, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fleet.coordinator.poll() is not None:
            raise RuntimeError(f"the coordinator exited: {fleet.log()[-2000:]}")
        try:
            get_json(f"{fleet.url}/api/status", timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the coordinator did not serve within {timeout:.0f} s")


@contextmanager
def live_fleet(
    specs: list[DeviceSpec], settings: FleetSettings, run_dir: Path, extra_devices: Sequence[str] = ()
) -> Iterator[LiveFleet]:
    """Enrol every device (specs' and extra_devices, which the bench runs itself), start the coordinator
    and the specs' device daemons; stop all at exit.
    """
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (run_dir / "devices").mkdir(exist_ok=True)
    admin = run_dir / "admin.token"
    admin.write_text(secrets.token_urlsafe(32) + "\n")
    admin.chmod(0o600)
    device_ids = [spec.name for spec in specs] + list(extra_devices)
    secret_files = {d: enrol(run_dir / "state", d, run_dir) for d in device_ids}
    port, broker_port, topics = free_port(), free_port(), Topics("fedspeech-attacks")
    args = _coordinator_args(run_dir, topics, settings, port, broker_port, len(device_ids))
    with open(logs / "coordinator.log", "w") as log:
        coordinator = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    fleet = LiveFleet(
        run_dir, f"http://127.0.0.1:{port}", f"mqtt://127.0.0.1:{broker_port}", topics, coordinator,
        admin.read_text().strip(), [], device_ids, Watch(),
    )  # fmt: skip
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(fleet, stop), name="watch")
    try:
        _wait_until_serving(fleet, 120)
        for spec in specs:
            common = ["--state", str(run_dir / "devices"), "--topic-root", fleet.topics.root]
            common += ["--enrolment-secret-file", str(secret_files[spec.name])]
            fleet.devices += launch_fleet([spec], fleet.url, fleet.broker_url, "fsdd", None, logs, common)
        watcher.start()
        yield fleet
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join()
        stop_fleet(fleet.devices)
        fleet.coordinator.terminate()
        try:
            fleet.coordinator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            fleet.coordinator.kill()
            fleet.coordinator.wait()


def enrolment_secret(fleet: LiveFleet, device_id: str) -> str:
    """The enrolment secret the operator wrote for a device the bench runs itself."""
    return (fleet.run_dir / f"{device_id}.secret").read_text().strip()
