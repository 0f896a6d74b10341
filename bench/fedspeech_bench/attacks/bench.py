"""`fedspeech bench attacks`: each attack against a live deployment of real processes, beside a clean run.

Every arm starts the same deployment afresh (the demo's emulated fleet of six FSDD devices, the last of
them run by the bench so that it may be compromised; default FedAvg, closed enrolment, an admin token)
and trains the same rounds, with one attack mounted from the start (the compromised device's from round
--attack-from, so that it may attack a model the fleet has trained). Each arm is compared with the clean
arm: the held-out accuracy of the last model, the median round time, the coordinator's peak resident
memory, the slowest honest `GET /api/status`, and in how many rounds the global model is bit for bit
the clean run's. An attack is "refused" when every attempt was turned away at the door, "defended"
when the fleet held (accuracy within 2 points, rounds within the attack's allowance, an honest status
answered within 1 s of the clean run's slowest, memory within 200 MiB, no round lost), "not defended"
otherwise, and "attack failed" when the attack could not be mounted at all. The devices keep both cores
busy, so even the clean run's status waits at times.
"""

import json
import logging
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from fedspeech.coordinator.state.records import RoundRecord
from fedspeech.coordinator.state.store import Store
from fedspeech_bench.attacks.catalogue import ATTACKS, CLEAN, CLEAN_SECURE, Attack, Evidence
from fedspeech_bench.attacks.live_fleet import FleetSettings, LiveFleet, MiB, Watch, live_fleet
from fedspeech_bench.fleets.cpu_limits import ONE_THREAD, DeviceProcess, run_limited
from fedspeech_bench.fleets.fleet_files import DeviceSpec, fleet_path, load_fleet
from fedspeech_bench.fleets.launch import proxied_urls

log = logging.getLogger(__name__)

FLEET = "pi5-pi4"  # the demo's
ACCURACY_POINTS, STATUS_S, RSS_MIB = 0.02, 1.0, 200


@dataclass
class Arm:
    """One arm's outcome: its attack, its rounds as stored, what the bench watched and what the attack saw."""

    attack: str
    rounds: list[RoundRecord]
    watch: Watch
    evidence: Evidence
    finished: bool

    @property
    def accuracy(self) -> float:
        """Held-out accuracy of the last model (0 if no round completed)."""
        return (self.rounds[-1].accuracy or 0.0) if self.rounds else 0.0

    @property
    def round_s(self) -> float:
        """Median seconds a round took (round 0 excluded)."""
        times = [r.wall_s for r in self.rounds if r.round > 0]
        return statistics.median(times) if times else float("inf")

    @property
    def rss_peak_mib(self) -> float:
        """The coordinator's peak resident memory while the fleet ran."""
        return self.watch.rss_peak / MiB


def verdict(attack: Attack, arm: Arm, clean: Arm) -> str:
    """refused, defended, not defended, or attack failed (see the module's docstring)."""
    if arm.evidence.failed:
        return "attack failed"
    held = (
        arm.finished
        and len(arm.rounds) == len(clean.rounds)
        and abs(arm.accuracy - clean.accuracy) <= ACCURACY_POINTS
        and arm.round_s - clean.round_s <= attack.round_time_allowance_s
        and arm.watch.slowest_status_s < clean.watch.slowest_status_s + STATUS_S
        and arm.watch.failed_statuses == 0
        and arm.rss_peak_mib - clean.rss_peak_mib < RSS_MIB
    )
    if not held:
        return "not defended"
    refused_all = arm.evidence.tried > 0 and arm.evidence.refused == arm.evidence.tried
    return "refused" if refused_all else "defended"


def same_models(arm: Arm, clean: Arm) -> int:
    """Rounds after round 0 whose global model is bit for bit the clean run's."""
    theirs = {r.round: r.weights_sha256 for r in clean.rounds}
    return sum(r.round > 0 and theirs.get(r.round) == r.weights_sha256 for r in arm.rounds)


def _start_insider(fleet: LiveFleet, spec: DeviceSpec, attack: str, attack_from: int) -> DeviceProcess:
    """The fleet's last device, run by the bench: honest, or mounting the attack from round attack_from."""
    coordinator, broker, proxies = proxied_urls(spec, fleet.url, fleet.broker_url)
    argv = [sys.executable, "-m", "fedspeech_bench.attacks.insider", attack, coordinator, broker]
    argv += [fleet.topics.root, str(fleet.run_dir / "devices"), spec.speaker, spec.name]
    argv += [str(fleet.run_dir / f"{spec.name}.secret"), "--from-round", str(attack_from)]
    log_path = fleet.run_dir / "logs" / f"{spec.name}.log"
    env = {**ONE_THREAD, "PYTHONUNBUFFERED": "1"}
    return run_limited(spec.cpu_share, argv, name=spec.name, log_path=log_path, env=env, proxies=proxies)


def _mounted(attack: Attack, fleet: LiveFleet, stop: threading.Event, evidence: Evidence) -> None:
    try:
        attack.mount(fleet, stop, evidence)
    except Exception as exc:  # the attack's own failure is part of what the table shows
        log.exception("attack %s failed", attack.name)
        evidence.failed = str(exc)
        evidence.notes.append(f"the attack itself failed: {exc}")


def _wait_finished(fleet: LiveFleet, devices: list[DeviceProcess], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fleet.coordinator.poll() is not None or any(d.proc.poll() is not None for d in devices):
            return False
        try:
            if fleet.status().get("finished"):
                return True
        except OSError:
            pass
        time.sleep(1.0)
    return False


def run_arm(attack: Attack, specs: list[DeviceSpec], settings: FleetSettings, run_dir: Path) -> Arm:
    """Run the deployment with the attack mounted from the start; its outcome once every round is done."""
    insider_spec = specs[-1]
    evidence, stop = Evidence(), threading.Event()
    settings = replace(settings, secure_aggregation=attack.secure)
    with live_fleet(specs[:-1], settings, run_dir, [insider_spec.name]) as fleet:
        insider = _start_insider(fleet, insider_spec, attack.insider, settings.attack_from)
        mount = threading.Thread(target=_mounted, args=(attack, fleet, stop, evidence), name=attack.name)
        try:
            mount.start()
            finished = _wait_finished(
                fleet, [*fleet.devices, insider], settings.rounds * settings.round_timeout_s + 300
            )
        finally:
            stop.set()
            if mount.is_alive():
                mount.join(timeout=120)
            insider.terminate()
            insider.stop()
        watch = fleet.watch
    return Arm(attack.name, Store(run_dir / "state").rounds(), watch, evidence, finished)


def attack_of(arm: Arm) -> Attack:
    """The attack an arm ran."""
    return {CLEAN.name: CLEAN, CLEAN_SECURE.name: CLEAN_SECURE, **ATTACKS}[arm.attack]


def clean_for(arm: Arm, arms: list[Arm]) -> Arm:
    """The clean arm an arm is measured against: the one run under secure aggregation if it was."""
    clean = CLEAN_SECURE if attack_of(arm).secure else CLEAN
    return next(a for a in arms if a.attack == clean.name)


def table(arms: list[Arm]) -> str:
    """The markdown table: every attack against its clean arm."""
    rows = [
        "| attack | result | accuracy (drift) | median round s (drift) | coordinator RSS peak MiB (drift) "
        "| slowest honest status s | model as clean | what happened |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        clean = clean_for(arm, arms)
        result = "-" if arm is clean else verdict(attack_of(arm), arm, clean)
        drift = (
            f"{arm.accuracy - clean.accuracy:+.4f}",
            f"{arm.round_s - clean.round_s:+.2f}",
            f"{arm.rss_peak_mib - clean.rss_peak_mib:+.1f}",
        )
        evidence = arm.evidence
        seen = f"{evidence.refused} of {evidence.tried} refused; " if evidence.tried else ""
        rows.append(
            f"| {arm.attack} | {result} | {arm.accuracy:.4f} ({drift[0]}) | {arm.round_s:.2f} ({drift[1]}) "
            f"| {arm.rss_peak_mib:.1f} ({drift[2]}) | {arm.watch.slowest_status_s:.3f} "
            f"| {same_models(arm, clean)} of {len(arm.rounds) - 1} | {seen}{'; '.join(evidence.notes)} |"
        )
    return "\n".join(rows)


COLOURS = {"-": "grey", "refused": "tab:green", "defended": "tab:olive", "not defended": "tab:red"}


def plot(arms: list[Arm], path: Path) -> None:
    """Accuracy, round time and coordinator memory per arm, as bars beside the clean arm's."""
    from fedspeech_bench.report.plots import pyplot

    plt = pyplot()
    names = [arm.attack for arm in arms]
    cleans = [clean_for(arm, arms) for arm in arms]
    results = [
        "-" if arm is clean else verdict(attack_of(arm), arm, clean)
        for arm, clean in zip(arms, cleans, strict=True)
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 5), sharey=True)
    for ax, (label, values) in zip(
        axes,
        [
            ("held-out accuracy of the last model", [a.accuracy for a in arms]),
            ("median round (s)", [a.round_s for a in arms]),
            ("coordinator RSS peak (MiB)", [a.rss_peak_mib for a in arms]),
        ],
        strict=True,
    ):
        ax.barh(names, values, color=[COLOURS[result] for result in results])
        ax.axvline(values[0], color="black", linewidth=0.8)
        ax.set(xlabel=label)
    axes[0].invert_yaxis()
    fig.suptitle(
        "fedspeech bench attacks against the clean run (black line): "
        "green refused, olive defended, red not defended"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_attacks(out: Path, names: list[str], settings: FleetSettings) -> list[Arm]:
    """Run the clean arm and each named attack's; write results.json, table.md and attacks.png to out."""
    specs = load_fleet(fleet_path(FLEET))
    arms: list[Arm] = []
    attacks = [ATTACKS[name] for name in names]
    for attack in [CLEAN, *([CLEAN_SECURE] if any(a.secure for a in attacks) else []), *attacks]:
        print(f"[{len(arms) + 1}] {attack.name}: {attack.what}", flush=True)
        arms.append(run_arm(attack, specs, settings, out / attack.name))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps([asdict(arm) for arm in arms], indent=1))
    text = table(arms)
    (out / "table.md").write_text(text + "\n")
    plot(arms, out / "attacks.png")
    print(text)
    print(f"\n{out / 'table.md'}, {out / 'attacks.png'}, {out / 'results.json'}")
    return arms
