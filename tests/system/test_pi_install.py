"""deploy/install.sh on an emulated Raspberry Pi: a Debian 12 arm64 system made with debootstrap, whose
programs run under qemu user emulation (binfmt_misc), installed from the wheel as a device is.

The listen-only device follows a coordinator running on this host (same network namespace) and runs a
model on a bundled FSDD clip; the device that trains imports torch 2.13.0 and enrols with a secret from
`fedspeech devices add`. Every step is timed (printed; `pytest -s` shows them).

It takes far longer than CI can give it (about 20 minutes: Debian's packages, then pip, all run
emulated), so it runs only with FEDSPEECH_PI_TEST=1, as root, with debootstrap, qemu-user-static and
binfmt-support installed, and Debian's mirror and PyPI reachable. FEDSPEECH_PI_BASE=DIR starts from a
copy of a root made earlier by `debootstrap --arch=arm64 --variant=minbase bookworm DIR` instead.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from tests.helpers.devices import Processes
from tests.helpers.ports import free_port
from tests.helpers.waiting import get_json, wait_for
from tests.helpers.wheels import CLIP, DETECTION, build_wheel, run


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The fedspeech wheel, built once per module."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


INSTALL = Path(__file__).resolve().parents[2] / "deploy" / "install.sh"
MIRROR = "http://deb.debian.org/debian"
VENV = "/opt/fedspeech"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # install.sh's default
# qemu-user shows programs this host's own /proc/cpuinfo, an x86 one, which ONNX Runtime's CPU detection
# on arm64 cannot parse (it crashes): the Pi gets a Raspberry Pi 4's, bound over it.
PI4_CPUINFO = (
    "".join(
        f"processor\t: {n}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n"
        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\n"
        "CPU revision\t: 3\n\n"
        for n in range(4)
    )
    + "Hardware\t: BCM2835\nModel\t\t: Raspberry Pi 4 Model B Rev 1.1\n"
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(7200),
    pytest.mark.skipif(
        os.environ.get("FEDSPEECH_PI_TEST") != "1",
        reason="about 20 min of emulated apt and pip, more than CI has: set FEDSPEECH_PI_TEST=1 to run it",
    ),
]


@contextmanager
def timed(step: str) -> Iterator[None]:
    """Print how long the step took."""
    start = time.monotonic()
    yield
    print(f"\n[pi timing] {step}: {time.monotonic() - start:.0f} s", flush=True)


def aarch64_emulation() -> None:
    """binfmt_misc runs arm64 programs through qemu-aarch64-static, or the test is skipped saying why."""
    if os.geteuid() != 0:
        pytest.skip("debootstrap, chroot and mount need root")
    for tool in ("debootstrap", "qemu-aarch64-static", "update-binfmts"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool}: apt-get install debootstrap qemu-user-static binfmt-support")
    binfmt = Path("/proc/sys/fs/binfmt_misc")
    if not (binfmt / "register").exists():
        mounted = subprocess.run(
            ["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt)], capture_output=True
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount binfmt_misc: {mounted.stderr.decode().strip()}")
    if not (binfmt / "qemu-aarch64").exists():
        enabled = subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], capture_output=True)
        if enabled.returncode != 0:
            pytest.skip(f"cannot register qemu-aarch64 with binfmt_misc: {enabled.stderr.decode().strip()}")
    if "enabled" not in (binfmt / "qemu-aarch64").read_text():
        pytest.skip("binfmt_misc's qemu-aarch64 is disabled")


def mounts_under(root: Path) -> list[str]:
    """The mount points inside root, deepest first."""
    points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    return sorted((p for p in points if p.startswith(f"{root}/")), key=len, reverse=True)


@pytest.fixture(scope="module")
def pi_root(tmp_path_factory) -> Iterator[Path]:
    """A Debian 12 arm64 root with /proc (a Pi 4's cpuinfo), /sys and /dev, trusting this host's CAs."""
    aarch64_emulation()
    root = tmp_path_factory.mktemp("pi") / "root"
    base = os.environ.get("FEDSPEECH_PI_BASE")
    with timed("debootstrap" if base is None else "copy of FEDSPEECH_PI_BASE"):
        if base:
            run(["cp", "-a", base, root], root.parent, 600)
        else:
            command = ["debootstrap", "--arch=arm64", "--variant=minbase", "bookworm", root, MIRROR]
            run(command, root.parent, 1800)
    assert run(["chroot", root, "uname", "-m"], root.parent, 60).stdout.strip() == "aarch64"
    # the CAs this host added (a TLS-inspecting proxy's, say): the device reaches PyPI through it too;
    # pip keeps its own CA list unless told to take the system's
    local = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    (root / "usr/local/share/ca-certificates").mkdir(parents=True, exist_ok=True)
    for ca in local:
        shutil.copy(ca, root / "usr/local/share/ca-certificates" / ca.name)
    if local:
        (root / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    cpuinfo = root.parent / "cpuinfo"
    cpuinfo.write_text(PI4_CPUINFO)
    for command in (
        ["mount", "-t", "proc", "proc", root / "proc"],
        ["mount", "--bind", cpuinfo, root / "proc/cpuinfo"],
        ["mount", "--rbind", "/sys", root / "sys"],
        ["mount", "--rbind", "/dev", root / "dev"],
    ):
        run(command, root.parent, 60)
    try:
        yield root
    finally:
        for point in mounts_under(root):
            subprocess.run(["umount", "-l", point], check=False)
        if not mounts_under(root):  # never delete through a mount of this host's /dev or /sys
            shutil.rmtree(root, ignore_errors=True)


def in_pi(root: Path, *args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run a program in the Pi's root, emulated, with a clean environment."""
    env = ["/usr/bin/env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8"]
    return run(["chroot", root, *env, *args], root, timeout)


def install(root: Path, *args: str | Path) -> subprocess.CompletedProcess:
    """deploy/install.sh --root ROOT ARGS."""
    return run([INSTALL, "--root", root, *args], root.parent, 3600)


def bundled_clip(root: Path) -> str:
    """The path, inside the Pi, of the FSDD clip that says "1", from the installed wheel."""
    locate = "import importlib.resources as r; print(r.files('fedspeech.data') / 'fsdd' / 'recordings')"
    return f"{in_pi(root, f'{VENV}/bin/python', '-c', locate).stdout.strip()}/{CLIP}"


def reachable(host: str) -> bool:
    """Whether a TCP connection to host:443 opens."""
    with suppress(OSError), socket.create_connection((host, 443), timeout=5):
        return True
    return False


def test_a_listen_only_pi_follows_the_coordinator(
    pi_root,
    wheel,
    fsdd_model,
    processes: Processes,
    mosquitto_url,
    topic_root,
    tmp_path,
):
    port = free_port()
    coordinator_url = f"http://127.0.0.1:{port}"
    with timed("install.sh --listen-only (apt-get, user, venv, pip)"):
        install(pi_root, "--listen-only", "--wheel", wheel, "--device-id", "kitchen-pi")
        install(pi_root, "--listen-only", "--coordinator", coordinator_url, "--broker", mosquitto_url)
    no_torch = subprocess.run(
        ["chroot", pi_root, f"{VENV}/bin/python", "-c", "import torch"], capture_output=True
    )
    assert b"No module named 'torch'" in no_torch.stderr
    machine = in_pi(pi_root, f"{VENV}/bin/python", "-c", "import platform; print(platform.machine())")
    assert machine.stdout.strip() == "aarch64"
    settings = (pi_root / "etc/default/fedspeech-listen").read_text().splitlines()
    assert settings == ["DEVICE_ID=kitchen-pi", f"COORDINATOR={coordinator_url}", f"BROKER={mosquitto_url}"]
    assert (pi_root / "etc/systemd/system/multi-user.target.wants/fedspeech-listen.service").is_symlink()

    clip = bundled_clip(pi_root)
    shutil.copy(fsdd_model.onnx_path, pi_root / "root/model.onnx")
    with timed("fedspeech listen --model --input, emulated"):
        heard = in_pi(
            pi_root, f"{VENV}/bin/fedspeech", "listen", "--model", "/root/model.onnx", "--input", clip
        )
    assert [label for _, label, _ in DETECTION.findall(heard.stdout)] == ["1"], heard.stdout

    # the coordinator on this host announces its initial model at once; the Pi checks its signature
    processes.start(
        "coordinator", "coordinator", "--state", str(tmp_path / "state"), "--new-state", "--port", str(port),
        "--broker", mosquitto_url, "--topic-root", topic_root,
    )  # fmt: skip
    wait_for(lambda: get_json(f"{coordinator_url}/api/status"), 120, "the coordinator")
    with timed("fedspeech listen --coordinator --input, emulated"):
        followed = in_pi(
            pi_root, f"{VENV}/bin/fedspeech", "listen", "--coordinator", coordinator_url,
            "--broker", mosquitto_url, "--topic-root", topic_root, "--input", clip,
        )  # fmt: skip
    logged = followed.stdout + followed.stderr
    assert re.search(r"downloaded model \S+ round 0 \(\d+ bytes\)", logged), logged


def test_a_pi_that_trains_imports_torch_and_enrols(
    pi_root,
    wheel,
    processes: Processes,
    mosquitto_url,
    topic_root,
    tmp_path,
):
    state = tmp_path / "state"
    port = free_port()
    coordinator_url = f"http://127.0.0.1:{port}"
    processes.start(
        "coordinator", "coordinator", "--state", str(state), "--new-state", "--port", str(port),
        "--broker", mosquitto_url, "--topic-root", topic_root,
    )  # fmt: skip
    wait_for(lambda: get_json(f"{coordinator_url}/api/status"), 120, "the coordinator")
    secret = tmp_path / "pi-train.secret"
    added = run(
        [sys.executable, "-m", "fedspeech", "devices", "add", "pi-train", "--state", state], tmp_path, 120
    )
    secret.write_text(added.stdout)

    # install.sh's torch index is PyTorch's CPU-only one; where it cannot be reached, PyPI's CUDA build
    torch_index = TORCH_CPU_INDEX if reachable("download.pytorch.org") else "https://pypi.org/simple"
    print(f"\n[pi timing] torch from {torch_index}", flush=True)
    with timed("install.sh (training: torch==2.13.0 and fedspeech[train,audio])"):
        install(
            pi_root, "--wheel", wheel, "--torch-index", torch_index, "--device-id", "pi-train",
            "--coordinator", coordinator_url, "--broker", mosquitto_url, "--enrolment-secret", secret,
        )  # fmt: skip
    with timed("import torch, emulated"):
        version = in_pi(pi_root, f"{VENV}/bin/python", "-c", "import torch; print(torch.__version__)")
    assert version.stdout.strip().split("+")[0] == "2.13.0"
    installed = pi_root / "etc/fedspeech/enrolment-secret"
    assert installed.read_text() == secret.read_text() and installed.stat().st_mode & 0o777 == 0o600

    # the daemon, as the unit runs it (but without TLS: this broker and coordinator are plain)
    client = subprocess.Popen(
        ["chroot", pi_root, f"{VENV}/bin/fedspeech", "client", "--device-id", "pi-train",
         "--coordinator", coordinator_url, "--broker", mosquitto_url, "--topic-root", topic_root,
         "--enrolment-secret-file", "/etc/fedspeech/enrolment-secret", "--state", "/var/lib/fedspeech/device",
         "--speaker", "jackson", "--max-samples", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip

    def online() -> bool:
        if client.poll() is not None:
            pytest.fail(f"the emulated client exited ({client.returncode})")
        return "pi-train" in (get_json(f"{coordinator_url}/api/status") or {}).get("devices_online", [])

    try:
        with timed("enrolment of the emulated device (start, profile, register, online)"):
            wait_for(online, 1200, "pi-train online and registered", interval=2)
        assert (pi_root / "var/lib/fedspeech/device/pi-train/token").is_file()
    finally:
        client.terminate()
        try:
            output, _ = client.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            client.kill()
            output, _ = client.communicate()
        print(output[-3000:])
