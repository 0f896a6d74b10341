"""The files of deploy/: systemd units, install.sh, the Prometheus config and the Grafana dashboard.

Mosquitto with the shipped deploy/mosquitto.conf and ACL, and clients really connecting to it over TLS
and in plain, are tests/system/test_broker_config.py's. Units are checked with systemd-analyze and install.sh
with shellcheck where they exist (Debian: apt-get install systemd shellcheck), else skipped saying so.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml  # PyYAML: amqtt, of the coordinator extra, depends on it

from fedspeech.__main__ import build_parser
from fedspeech.coordinator.config import ServiceConfig
from fedspeech.coordinator.http.metrics import METRIC_NAMES
from tests.helpers.devices import Processes
from tests.helpers.ports import free_port
from tests.helpers.waiting import wait_for
from tests.helpers.wheels import CLIP, DETECTION, build_wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The fedspeech wheel, built once per module."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNITS = sorted(DEPLOY.glob("*.service"))
FEDSPEECH = "/opt/fedspeech/bin/fedspeech"  # where install.sh puts the command the units run
ADMIN_TOKEN = "/etc/fedspeech/admin-token"
HISTOGRAMS = {"fedspeech_round_duration_seconds"}  # of METRIC_NAMES: queried as _bucket, _sum and _count
LABELS = {  # the labels the coordinator's metrics carry, and their values
    "reason": {"unauthorized", "too_large", "invalid", "not_wanted"},
    "direction": {"up", "down"},
    "evaluation": {"central", "federated"},
    "delta": None,  # differential privacy's delta, any the operator sets
    "le": None,
}
# PromQL's functions and keywords the dashboard may use; any other name in an expression must be a metric
PROMQL = {"sum", "max", "min", "avg", "rate", "increase", "irate", "histogram_quantile", "by", "without"}
PROMQL |= {"on", "ignoring", "and", "or", "unless", "offset", "clamp_min", "clamp_max", "abs", "vector"}

pytestmark = pytest.mark.timeout(300)


def unit_settings(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of each setting of a unit file, in order, with continued lines joined."""
    section, settings, pending = "", [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith(("#", ";"))):
            continue
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line.startswith("["):
            section = line.strip("[]")
        else:
            key, _, value = line.partition("=")
            settings.append((section, key.strip(), value.strip()))
    return settings


def service(path: Path, key: str) -> list[str]:
    """Every value of key in the unit's [Service] section."""
    return [value for section, k, value in unit_settings(path) if section == "Service" and k == key]


def analyzable_copy(unit: Path, folder: Path) -> Path:
    """A copy of unit whose command is an executable that exists (systemd-analyze checks that it does)."""
    fake = folder / "fedspeech"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    text = unit.read_text()
    assert FEDSPEECH in text, f"{unit.name} does not run {FEDSPEECH}"
    copy = folder / unit.name
    copy.write_text(text.replace(FEDSPEECH, str(fake)))
    return copy


def systemd_analyze() -> str:
    """The systemd-analyze binary, or skip."""
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("no systemd-analyze here (Debian: apt-get install systemd)")
    return found


def verify_messages(unit: Path) -> str:
    """What `systemd-analyze verify` says about a unit file: nothing when it is sound."""
    result = subprocess.run(
        [systemd_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=120
    )
    return (result.stdout + result.stderr).strip() + (
        "" if result.returncode == 0 else f" (exit {result.returncode})"
    )


@pytest.mark.parametrize("unit", UNITS, ids=[u.stem for u in UNITS])
def test_systemd_analyze_verify_finds_nothing(unit, tmp_path):
    assert verify_messages(analyzable_copy(unit, tmp_path)) == ""


def test_systemd_analyze_verify_would_see_a_broken_unit(tmp_path):
    """The check above is not blind: a wrong key, a bad value and a missing command are all reported."""
    broken = tmp_path / "broken.service"
    text = (DEPLOY / "fedspeech-client.service").read_text()
    broken.write_text(text.replace("ProtectSystem=strict", "ProtectSystem=strictly\nProtectSistem=true"))
    messages = verify_messages(broken)
    assert "ProtectSistem" in messages and "strictly" in messages and FEDSPEECH in messages, messages


@pytest.mark.parametrize("unit", UNITS, ids=[u.stem for u in UNITS])
def test_systemd_rates_the_sandbox_ok(unit, tmp_path):
    copy = analyzable_copy(unit, tmp_path)
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", str(copy)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d)", result.stdout)
    assert found, result.stdout + result.stderr
    # 0 is a service that can do nothing, 10 one that can do anything (the units before hardening: 8.5)
    assert float(found.group(1)) <= 2.0, result.stdout


@pytest.mark.parametrize("unit", UNITS, ids=[u.stem for u in UNITS])
def test_units_are_hardened(unit):
    def one(key: str) -> str:
        values = service(unit, key)
        assert len(values) == 1, f"{unit.name}: {key}= {values}"
        return values[0]

    expected = {
        "User": "fedspeech",
        "NoNewPrivileges": "true",
        "ProtectSystem": "strict",
        "ProtectHome": "true",
        "PrivateTmp": "true",
        "CapabilityBoundingSet": "",  # no capabilities at all
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "Restart": "on-failure",
    }
    assert {key: one(key) for key in expected} == expected
    assert service(unit, "SystemCallFilter")[0] == "@system-service"
    if "listen" in unit.name:  # the microphone: ALSA's devices, through group audio
        assert not service(unit, "PrivateDevices")
        assert (one("DevicePolicy"), one("DeviceAllow"), one("SupplementaryGroups")) == (
            "closed",
            "char-alsa rw",
            "audio",
        )
    else:
        assert one("PrivateDevices") == "true"
        assert one("StateDirectory") == "fedspeech"  # /var/lib/fedspeech: writable, all else read-only


@pytest.mark.parametrize("unit", UNITS, ids=[u.stem for u in UNITS])
def test_exec_start_is_a_valid_fedspeech_command(unit):
    (exec_start,) = service(unit, "ExecStart")
    argv = shlex.split(exec_start)
    assert argv[0] == FEDSPEECH
    command = unit.stem.removeprefix("fedspeech-")
    assert argv[1] == command

    # variables: set by Environment= or documented in the header for the EnvironmentFile
    header = unit.read_text().split("\n[Unit]")[0]
    defaults = dict(item.split("=", 1) for line in service(unit, "Environment") for item in line.split())
    used = set(re.findall(r"\$\{(\w+)\}", exec_start)) | set(re.findall(r"\$(\w+)", exec_start))
    undocumented = [v for v in used if v not in defaults and not re.search(rf"#\s+{v}=", header)]
    assert not undocumented, f"{unit.name}: set them in Environment= or document them: {undocumented}"

    # credentials: every %d/NAME is loaded, every loaded one is used, all from /etc/fedspeech
    loaded = dict(value.split(":", 1) for value in service(unit, "LoadCredential"))
    assert set(re.findall(r"%d/([\w.-]+)", exec_start)) == set(loaded)
    assert all(source == f"/etc/fedspeech/{name}" for name, source in loaded.items()), loaded

    # the real parser takes it, with sample values: systemd splits $OPTIONS into words (here none)
    samples = {"COORDINATOR": "https://coordinator.lan:8443", "BROKER": "mqtts://coordinator.lan:8883"}
    samples |= {"DEVICE_ID": "kitchen-pi", "DATA": "/var/lib/fedspeech/data", "HOST": "192.168.1.10"}
    args = []
    for word in argv[2:]:
        if word == "$OPTIONS":
            continue
        word = re.sub(r"\$\{(\w+)\}", lambda m: samples[m.group(1)], word)
        args.append(word.replace("%d", "/run/credentials/x").replace("%H", "kitchen-pi"))
    try:
        parsed = build_parser().parse_args([command, *args])
    except SystemExit:
        pytest.fail(f"`fedspeech {command}` refuses the options of {unit.name} (its error is above)")
    if command == "listen":
        assert parsed.coordinator and parsed.model is None and parsed.input is None
    if command == "coordinator":
        assert str(parsed.admin_token_file) == "/run/credentials/x/admin-token"
        assert loaded["admin-token"] == ADMIN_TOKEN


# What MemoryDenyWriteExecute= would do, through the kernel's own switch for it (PR_SET_MDWE, Linux 6.3)
MDWE = """
import ctypes, sys
if ctypes.CDLL(None).prctl(65, 1, 0, 0, 0) != 0:  # PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN
    sys.exit(3)
"""


@pytest.mark.parametrize(
    ("units", "code", "error"),
    [
        (  # the client and the coordinator train and evaluate with torch
            "fedspeech-client, fedspeech-coordinator",
            "import torch; torch.nn.Conv2d(1, 4, 3)(torch.randn(2, 1, 16, 16))",
            "could not create a primitive",
        ),
        (  # the listener's microphone: sounddevice hands PortAudio a cffi callback
            "fedspeech-listen",
            "import sounddevice; sounddevice._ffi.callback('void(int)', lambda x: None)",
            "Cannot allocate write+execute memory",
        ),
    ],
    ids=["torch", "microphone"],
)
def test_memory_deny_write_execute_would_break_the_units(units, code, error):
    """Why the units leave MemoryDenyWriteExecute out; when this fails, they may take it."""
    for name in units.split(", "):
        assert not service(DEPLOY / f"{name}.service", "MemoryDenyWriteExecute")
    result = subprocess.run([sys.executable, "-c", MDWE + code], capture_output=True, text=True, timeout=120)
    if result.returncode == 3:
        pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3 and later)")
    assert result.returncode != 0 and error in result.stderr, result.stderr[-2000:]


def test_prometheus_scrapes_the_coordinators_metrics_with_the_admin_token():
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["scheme"] == "http"
    assert job["authorization"] == {"type": "Bearer", "credentials_file": ADMIN_TOKEN}
    targets = [target for group in job["static_configs"] for target in group["targets"]]
    service = ServiceConfig()  # where `fedspeech coordinator` listens unless told otherwise
    assert targets == [f"{service.host}:{service.port}"]


def test_promtool_checks_the_prometheus_config(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool here (Debian: apt-get install prometheus)")
    token = tmp_path / "admin-token"
    token.write_text("secret\n")
    config = tmp_path / "prometheus.yml"
    config.write_text((DEPLOY / "prometheus.yml").read_text().replace(ADMIN_TOKEN, str(token)))
    result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def dashboard_exprs() -> list[str]:
    """Every query of deploy/grafana-dashboard.json."""
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def expr_names(expr: str) -> tuple[set[str], set[str], set[tuple[str, str]]]:
    """The names an expression uses: (metrics and functions, labels, (label, value) of its matchers)."""
    matchers = re.findall(r"\{([^}]*)\}", expr)
    pairs = {(k, v) for m in matchers for k, v in re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', m)}
    grouped = {
        label for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr) for label in group.split(",")
    }
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(by|without)\s*\([^)]*\)|\"[^\"]*\"", " ", expr)
    words = set(re.findall(r"\b[a-zA-Z_:][\w:]*\b", bare)) - {"e"}  # e: of a number like 1e3
    return words, {label.strip() for label in grouped} | {k for k, _ in pairs}, pairs


def test_dashboard_queries_only_the_coordinators_metrics():
    allowed = set(METRIC_NAMES) | {
        name + suffix for name in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")
    }
    assert set(METRIC_NAMES) >= HISTOGRAMS
    used: set[str] = set()
    for expr in dashboard_exprs():
        words, labels, pairs = expr_names(expr)
        metrics = words - PROMQL
        assert metrics, f"no metric in {expr!r}"
        assert metrics <= allowed, f"{expr!r} uses {sorted(metrics - allowed)}, not among {sorted(allowed)}"
        assert labels <= set(LABELS), f"{expr!r} uses labels {sorted(labels - set(LABELS))}"
        assert all(LABELS[k] is None or v in LABELS[k] for k, v in pairs), expr
        used |= {re.sub(r"_(bucket|sum|count)$", "", m) if m not in METRIC_NAMES else m for m in metrics}
    assert used == set(METRIC_NAMES), f"no panel shows {sorted(set(METRIC_NAMES) - used)}"


def test_dashboard_has_the_panels_and_a_prometheus_variable():
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    assert dashboard["schemaVersion"] >= 36
    (variable,) = dashboard["templating"]["list"]
    assert (variable["type"], variable["query"], variable["name"]) == (
        "datasource",
        "prometheus",
        "datasource",
    )
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        for source in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]:
            assert source == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    exprs = " ".join(dashboard_exprs())
    for wanted in (
        "histogram_quantile(0.5,",
        "histogram_quantile(0.95,",
        "sum by (reason)",
        "sum by (direction)",
    ):
        assert wanted in exprs
    cells = [
        (p["gridPos"]["x"] + dx, p["gridPos"]["y"] + dy)
        for p in panels
        for dx in range(p["gridPos"]["w"])
        for dy in range(p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells)), "panels overlap"
    assert all(x < 24 for x, _ in cells), "a panel is wider than the grid"


def test_the_coordinator_serves_what_the_dashboard_queries(
    processes: Processes, mosquitto_url, topic_root, tmp_path
):
    token = tmp_path / "admin-token"
    token.write_text("a-token-for-prometheus-0123456789\n")
    port = free_port()
    coordinator = processes.start(
        "coordinator", "coordinator", "--state", str(tmp_path / "state"), "--new-state", "--port", str(port),
        "--broker", mosquitto_url, "--topic-root", topic_root, "--admin-token-file", str(token),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape(headers: dict[str, str]) -> tuple[int, str] | None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except OSError:
            if coordinator.poll() is not None:
                pytest.fail(f"the coordinator exited:\n{coordinator.log_path.read_text()[-3000:]}")
            return None

    # as Prometheus sends it: the file's content, whitespace trimmed, as a bearer token
    bearer = {"Authorization": f"Bearer {token.read_text().strip()}"}
    status, text = wait_for(lambda: scrape(bearer), 60, "the coordinator's /metrics")
    assert status == 200
    assert scrape({})[0] == 401
    served = set(re.findall(r"^(fedspeech_\w+)", text, re.MULTILINE))
    served |= set(re.findall(r"^# TYPE (fedspeech_\w+)", text, re.MULTILINE))  # a gauge with no value yet
    queried = set().union(*(expr_names(expr)[0] for expr in dashboard_exprs())) - PROMQL
    assert queried <= served, f"not served: {sorted(queried - served)}\n{text}"


def test_install_sh_is_sound_bash():
    script = DEPLOY / "install.sh"
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True)
    usage = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True).stdout
    assert "--listen-only" in usage and "--root DIR" in usage
    wrong = subprocess.run([str(script), "--no-such-option"], capture_output=True, text=True)
    assert (wrong.returncode, wrong.stdout) == (1, "")
    assert wrong.stderr == "install.sh: unknown option --no-such-option (--help lists them)\n"


def test_shellcheck_finds_nothing_in_the_scripts():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("no shellcheck here (Debian: apt-get install shellcheck)")
    result = subprocess.run([shellcheck, str(DEPLOY / "install.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.slow
def test_install_sh_listen_only_into_a_prefix(wheel, fsdd_model, tmp_path):
    """install.sh --prefix: the venv, the configuration and the unit under a folder, run twice."""
    prefix = tmp_path / "root"
    secret = tmp_path / "kitchen-pi.secret"
    secret.write_text("s3cret\n")
    argv = [str(DEPLOY / "install.sh"), "--prefix", str(prefix), "--listen-only", "--wheel", str(wheel)]
    argv += ["--coordinator", "http://coordinator.lan:8080", "--broker", "mqtt://coordinator.lan:1883"]
    argv += ["--device-id", "kitchen-pi", "--enrolment-secret", str(secret)]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr

    unit = prefix / "etc/systemd/system/fedspeech-listen.service"
    assert unit.read_text() == (DEPLOY / "fedspeech-listen.service").read_text()
    defaults = prefix / "etc/default/fedspeech-listen"
    settings = dict(line.split("=", 1) for line in defaults.read_text().splitlines())
    assert settings == {
        "DEVICE_ID": "kitchen-pi",
        "COORDINATOR": "http://coordinator.lan:8080",
        "BROKER": "mqtt://coordinator.lan:1883",
    }
    header = unit.read_text().split("\n[Unit]")[0]
    assert all(f"#   {key}=" in header for key in settings), "the unit does not document a setting"
    installed_secret = prefix / "etc/fedspeech/enrolment-secret"
    assert installed_secret.read_text() == "s3cret\n"
    assert installed_secret.stat().st_mode & 0o777 == 0o600

    venv = prefix / "opt/fedspeech"
    no_torch = subprocess.run([venv / "bin/python", "-c", "import torch"], capture_output=True, text=True)
    assert "No module named 'torch'" in no_torch.stderr
    clip = tmp_path / CLIP
    locate = "import importlib.resources as r; print(r.files('fedspeech.data'))"
    data = subprocess.run([venv / "bin/python", "-c", locate], capture_output=True, text=True, check=True)
    shutil.copyfile(Path(data.stdout.strip()) / "fsdd" / "recordings" / CLIP, clip)
    listen = [venv / "bin/fedspeech", "listen", "--model", fsdd_model.onnx_path, "--input", clip]
    heard = subprocess.run(listen, capture_output=True, text=True, timeout=120)
    assert [label for _, label, _ in DETECTION.findall(heard.stdout)] == ["1"], heard.stdout + heard.stderr

    # again: nothing to do, nothing changed
    files = [unit, defaults, installed_secret]
    before = [(f.read_bytes(), f.stat().st_mtime_ns) for f in files]
    second = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout + second.stderr
    assert [(f.read_bytes(), f.stat().st_mtime_ns) for f in files] == before
    assert "creating the venv" not in second.stdout and "/etc/" not in second.stdout, second.stdout
