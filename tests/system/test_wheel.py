"""The wheel: built from the source tree, installed into fresh venvs outside it, run from there.

The fedspeech wheel carries no benchmark nor emulated fleet: those are fedspeech-bench's (bench/), whose
wheel the demo's venv installs beside it.

Slow (a few minutes: one build, two installs, a short demo), so it is marked `slow`; it still runs by
default, as in CI. Every command's output goes into the failure message.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.wheels import CLIP, DETECTION, ROOT, build_wheel, output, run

REPORT = "@@fedspeech-wheel-test@@ "  # marks the line the wrapper scripts print after main() returns

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(
        importlib.util.find_spec("ensurepip") is None,
        reason="`python -m venv` cannot install pip here (Debian: apt-get install python3-venv)",
    ),
]

# Runs the `fedspeech` command in-process and then reports where every fedspeech module came from, and
# every attempt to import torch: a finder ahead of the others sees it even where torch is not installed.
WRAPPER = """
import importlib.abc, json, sys

class TorchWatch(importlib.abc.MetaPathFinder):
    tried = []

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            self.tried.append(name)
        return None

sys.meta_path.insert(0, TorchWatch())
from fedspeech.__main__ import main

try:
    main(sys.argv[1:])
finally:
    ours = [name for name in sys.modules if name.split(".")[0] in ("fedspeech", "fedspeech_bench")]
    modules = {name: getattr(sys.modules[name], "__file__", None) for name in ours}
    report = {"torch_tried": TorchWatch.tried, "onnxruntime": "onnxruntime" in sys.modules}
    print(MARK + json.dumps(report | {"modules": modules}), flush=True)
""".replace("MARK", repr(REPORT))


def report(result: subprocess.CompletedProcess) -> dict:
    """The JSON line the wrapper printed after the command returned."""
    lines = [line for line in result.stdout.splitlines() if line.startswith(REPORT)]
    assert lines, f"the wrapper printed no report\n{output(result.stdout, result.stderr)}"
    return json.loads(lines[-1][len(REPORT) :])


class Venv:
    """A fresh venv with the wheel installed, and commands run from it, outside the checkout."""

    def __init__(self, folder: Path, *requirements: str) -> None:
        """Create the venv in folder and pip-install the requirements into it."""
        assert not folder.resolve().is_relative_to(ROOT), f"{folder} is inside the checkout"
        self.folder, self.cwd = folder, folder.parent
        self.bin = folder / "bin"
        self.python = self.bin / "python"
        # only what an activated venv would have: nothing from this test run's interpreter
        drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE"}
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env |= {"VIRTUAL_ENV": str(folder), "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}"}
        self.env |= {"PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1"}
        run([sys.executable, "-m", "venv", folder], self.cwd, 300)
        # --no-compile: pip would byte-compile all of torch, most of which the test never imports
        pip = [self.python, "-m", "pip", "install", "--no-input", "--no-compile", *requirements]
        run(pip, self.cwd, 900, self.env)

    def run(self, *args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run a program of the venv (python, fedspeech, ...) with the given arguments."""
        return run([self.bin / args[0], *args[1:]], self.cwd, timeout, self.env)

    def fedspeech(self, *args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run `fedspeech ARGS` through the wrapper (same main as the console script) with its report."""
        return self.run("python", "-c", WRAPPER, *args, timeout=timeout)

    def assert_inside(self, path: str | Path | None, what: str) -> None:
        """The path lies in this venv (not in the checkout)."""
        assert path is not None, f"{what} has no file"
        assert Path(path).resolve().is_relative_to(self.folder.resolve()), f"{what} is {path}, not in {self}"

    def remove(self) -> None:
        """Delete the venv (1.4 GB with torch); a failed test keeps it for a look."""
        shutil.rmtree(self.folder)

    def __str__(self) -> str:
        """The venv's folder."""
        return str(self.folder)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The fedspeech wheel, built once per module."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def bench_wheel(wheel) -> Path:
    """fedspeech-bench's wheel, built from bench/ of the same copy of the source tree."""
    source = wheel.parents[1] / "source" / "bench"
    run([sys.executable, "-m", "build", "--wheel", "--outdir", wheel.parent, source], wheel.parents[1], 600)
    (path,) = wheel.parent.glob("fedspeech_bench-*.whl")
    return path


@pytest.fixture(scope="module")
def plain_venv(wheel, tmp_path_factory) -> Iterator[Venv]:
    """A venv with the wheel and none of its extras: no torch, no flask, no sounddevice."""
    venv = Venv(tmp_path_factory.mktemp("plain") / "venv", str(wheel))
    yield venv
    venv.remove()


def expected_files(source: Path) -> set[str]:
    """What a wheel of source must hold besides its metadata: every module, the data and the dashboard."""
    setuptools = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]
    files = set()
    for package, folder in setuptools["package-dir"].items():
        data_folder = package == "fedspeech.data"
        for path in (source / folder).rglob("*"):
            relative = path.relative_to(source / folder)
            if path.is_dir() or "__pycache__" in relative.parts or relative.name.startswith("."):
                continue
            dashboard = package == "fedspeech.coordinator" and relative.parts[:2] == ("http", "web")
            if path.suffix == ".py" or path.name == "py.typed" or data_folder or dashboard:
                files.add("/".join([*package.split("."), *relative.parts]))
    return files


def test_wheel_holds_the_code_and_the_data_and_no_benchmark(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = archive.read(entry_points).decode()
    files = {name for name in names if not name.split("/")[0].endswith(".dist-info")}
    recordings = [n for n in files if n.startswith("fedspeech/data/fsdd/recordings/") and n.endswith(".flac")]
    assert len(recordings) == 3000
    assert {"fedspeech/data/fsdd/LICENSE", "fedspeech/data/fsdd/SOURCE.md"} <= files
    source = wheel.parents[1] / "source"  # the copy it was built from
    # the benchmarks, the demo and the emulated fleet are fedspeech-bench's, not the devices'
    bench = [n for n in files if n.startswith(("fedspeech/fleets/", "fedspeech_bench/"))]
    bench += [n for n in files if re.match(r"fedspeech/(bench|demo|fleet_run|progress)\w*\.py$", n)]
    assert not bench, f"benchmark or fleet code in the wheel: {sorted(bench)}"
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n or n.endswith(".pyc")]
    expected = expected_files(source)
    assert not expected - files, f"missing from the wheel: {sorted(expected - files)}"
    assert not files - expected, f"not expected in the wheel: {sorted(files - expected)}"
    assert "fedspeech = fedspeech.__main__:main" in entry_points
    assert "fedspeech.commands" not in entry_points


def test_listen_runs_from_the_wheel_without_torch(plain_venv, fsdd_model):
    venv = plain_venv
    no_torch = subprocess.run(
        [venv.python, "-c", "import torch"], capture_output=True, text=True, env=venv.env, timeout=120
    )
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr, no_torch.stderr

    locate = "import importlib.resources as r; print(r.files('fedspeech.data'))"
    data = Path(venv.run("python", "-c", locate).stdout.strip())
    venv.assert_inside(data, "the bundled data")
    clip = data / "fsdd" / "recordings" / CLIP
    assert clip.is_file()

    # the console script, as a device runs it
    listened = venv.run("fedspeech", "listen", "--model", fsdd_model.onnx_path, "--input", clip)
    labels = [label for _, label, _ in DETECTION.findall(listened.stdout)]
    assert labels, f"no detection\n{output(listened.stdout, listened.stderr)}"
    assert set(labels) == {"1"}, f"heard {labels} in {CLIP}"

    # without fedspeech-bench, the demo is one line saying how to install it
    demo = subprocess.run(
        [venv.bin / "fedspeech", "demo"], capture_output=True, text=True, env=venv.env, timeout=120
    )
    assert demo.returncode != 0 and demo.stderr.strip().splitlines() == [
        "fedspeech demo: install the benchmarks from a checkout: pip install -e ./bench"
    ], output(demo.stdout, demo.stderr)

    # the same command in-process, watched: torch is never even looked for
    watched = report(venv.fedspeech("listen", "--model", fsdd_model.onnx_path, "--input", clip))
    assert watched["torch_tried"] == []
    assert watched["onnxruntime"]
    for name, path in watched["modules"].items():
        venv.assert_inside(path, name)


# each command run without its extra, and what it must say
WITHOUT_EXTRAS = {
    "coordinator": (["coordinator", "--port", "0"], "coordinator", "torch, onnx, onnxscript, flask"),
    "client": (["client", "--speaker", "theo"], "train", "torch, onnx, onnxscript"),
    "listen": (["listen", "--model", "model.onnx"], "audio", "sounddevice"),
    "record": (["record", "--task", "fsdd", "--label", "1", "--data", "takes"], "audio", "sounddevice"),
}


def test_a_command_without_its_extra_names_the_extra_to_install_in_one_line(plain_venv):
    for command, (args, extra, modules) in WITHOUT_EXTRAS.items():
        result = subprocess.run(
            [plain_venv.bin / "fedspeech", *args],
            capture_output=True, text=True, env=plain_venv.env, cwd=plain_venv.cwd, timeout=120,
        )  # fmt: skip
        said = output(result.stdout, result.stderr)
        assert result.returncode == 1 and "Traceback" not in result.stderr, said
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"fedspeech {command}: needs {modules}"), line
        assert line.endswith(f'which the {extra} extra installs: pip install "fedspeech[{extra}]"'), line
    assert not (plain_venv.cwd / "fedspeech-state").exists(), "the coordinator stopped before its state"

    # the command it names works where fedspeech came from a wheel: pip keeps the installed fedspeech
    plain_venv.run("python", "-m", "pip", "install", "--no-input", "fedspeech[audio]")
    installed = plain_venv.run("python", "-m", "pip", "show", "--files", "fedspeech").stdout
    assert "Version: 0.1.0" in installed
    listed = subprocess.run(
        [plain_venv.bin / "fedspeech", "listen", "--list-devices"],
        capture_output=True, text=True, env=plain_venv.env, cwd=plain_venv.cwd, timeout=120,
    )  # fmt: skip
    assert "needs sounddevice" not in listed.stderr, output(listed.stdout, listed.stderr)


def test_the_readmes_wheel_install_command_names_the_wheel_when_pasted(tmp_path):
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"`(pip install [^`]*\.whl[^`]*)`", readme)
    assert commands, "the README says how a device installs the wheel"
    wheel = tmp_path / "fedspeech-0.1.0-py3-none-any.whl"  # as copied to a device
    wheel.write_bytes(b"")
    for command in commands:  # pasted into bash, with a pip that shows what it was given
        shown = subprocess.run(
            ["bash", "-c", f'pip() {{ printf "%s\\n" "$@"; }}; {command}'],
            cwd=tmp_path, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        arguments = shown.stdout.splitlines()
        assert arguments[0] == "install", command
        requirement = arguments[-1]
        assert requirement.startswith(f"{wheel.name}["), f"{command} gives pip {requirement!r}"


def test_demo_and_device_commands_run_from_the_wheel_with_extras(wheel, bench_wheel, tmp_path):
    venv = Venv(tmp_path / "venv", f"{wheel}[train,coordinator]", str(bench_wheel))
    out = tmp_path / "demo"
    argv = ["demo", "--rounds", "2", "--full-speed", "--max-samples", "60", "--out", out]
    demo = venv.fedspeech(*argv, timeout=900)
    for name in ("model.onnx", "metrics.json", "accuracy.png"):
        path = out / name
        assert path.is_file() and path.stat().st_size > 0, f"no {name}\n{output(demo.stdout, demo.stderr)}"
    assert json.loads((out / "metrics.json").read_text())["final"]["round"] == 2
    assert re.search(r"round +2/2 .*about 0s left", demo.stdout), demo.stdout
    where = "import fedspeech.coordinator.http as h, pathlib; print(pathlib.Path(h.__file__).parent / 'web')"
    web = Path(venv.run("python", "-c", where).stdout.strip())
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        assert (web / name).is_file(), f"the wheel lacks the dashboard's {name}"
    modules = report(demo)["modules"]
    assert "fedspeech_bench.demo" in modules
    for name, path in modules.items():
        venv.assert_inside(path, name)

    client = venv.run("fedspeech", "client", "--help").stdout
    assert all(option in client for option in ("--coordinator", "--broker", "--data", "--device-id"))
    record = venv.run("fedspeech", "record", "--help").stdout
    assert all(option in record for option in ("--task", "--label", "--count", "--data"))
    venv.remove()
