"""Shared fixtures: the machine's Mosquitto, topic roots, coordinator and device processes, a microphone.

And the tiers: each test is marked with the folder it is in (unit, integration, system).
"""

import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fedspeech.protocol.messages import ModelSpec
from tests.helpers.devices import Processes
from tests.helpers.mqtt_clients import Client
from tests.helpers.waiting import wait_for

MOSQUITTO = ("127.0.0.1", 1883)
TIERS = ("unit", "integration", "system")  # the folders of tests/, and their markers: `pytest -m unit`


def pytest_addoption(parser: pytest.Parser) -> None:
    """--alone skip|only: leave out the tests marked alone, or run only those (tests/run runs them last)."""
    parser.addoption(
        "--alone", choices=("skip", "only"), help="skip the tests marked alone, or run only those"
    )


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker, and before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier; run each file of the integration and system tiers on one worker.

    Under `--dist loadgroup` (tests/run) a file's tests then share its module fixtures (a trained model, a
    built wheel, a running fleet), made once. A file whose tests use something the machine has only one of
    (a PulseAudio server, a browser) names it in an xdist_group mark of its own instead: files of one group
    run one after the other. Tests that measure the machine's speed are marked alone: tests/run runs them
    after the others, with nothing beside them.
    """
    here = Path(__file__).parent
    for item in items:
        tier = item.path.relative_to(here).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(
                f"{item.path}: a test file belongs in tests/unit, tests/integration or tests/system"
            )
        item.add_marker(tier)
        if tier != "unit" and not any(item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
        if "fsdd_model" in item.fixturenames:
            # trained for the first test on a worker that needs it, whichever that is: minutes on a busy
            # machine, no part of that test's own time limit, which then bounds its body alone
            limit = item.get_closest_marker("timeout")
            seconds = limit.args[0] if limit is not None else config.getini("timeout")
            item.add_marker(pytest.mark.timeout(seconds, func_only=True))
    alone = config.getoption("alone")
    if alone is not None:
        wanted = {item for item in items if (item.get_closest_marker("alone") is None) == (alone == "skip")}
        config.hook.pytest_deselected(items=[item for item in items if item not in wanted])
        items[:] = [item for item in items if item in wanted]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print what a passing test measured (record_property("figures", ...)): its output is hidden."""
    for report in terminalreporter.getreports("passed"):
        for name, value in report.user_properties:
            if name == "figures":
                terminalreporter.write_line(str(value))


@pytest.fixture(scope="session")
def mosquitto_url() -> str:
    """The machine's Mosquitto broker; the suite needs it running."""
    try:
        socket.create_connection(MOSQUITTO, timeout=2).close()
    except OSError:
        pytest.fail("no MQTT broker on 127.0.0.1:1883: start Mosquitto (`mosquitto -d`)")
    return f"mqtt://{MOSQUITTO[0]}:{MOSQUITTO[1]}"


@pytest.fixture
def topic_root() -> str:
    """A topic root of its own, so tests sharing the broker never see each other's messages."""
    return f"fedspeech-test/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def processes(tmp_path) -> Iterator[Processes]:
    """Start subprocesses that are cleaned up after the test."""
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    """MQTT clients made by the test, closed at its end."""
    made: list[Client] = []
    yield made
    for client in made:
        client.close()


@dataclass
class TrainedModel:
    """A CNN trained centrally on every FSDD speaker's training clips, exported to ONNX."""

    model: Any
    spec: ModelSpec
    labels: list[str]
    onnx_path: Path
    heldout: tuple[Any, Any]  # waveforms and labels of FSDD's test split, none of them trained on
    calibration: Any  # a few hundred training waveforms


@pytest.fixture(scope="session")
def fsdd_model(tmp_path_factory, worker_id) -> TrainedModel:
    """Trained once per test run as devices train, with the bundled negatives (~40 s on one core): the
    first worker to ask trains and exports it, the others of the run read its files.
    """
    import numpy as np
    import torch
    from filelock import FileLock

    from fedspeech.models import build_model
    from fedspeech.models.clips.datasets import default_spec, load_corpus, load_waveforms, server_test_clips
    from fedspeech.models.train import set_arrays
    from fedspeech.protocol import weights

    torch.set_num_threads(1)  # in every worker, as the worker that trains it
    corpus = load_corpus("fsdd")
    spec, labels = default_spec(corpus), list(corpus.task.labels)
    waveforms, targets = load_waveforms(
        [c for c in corpus.clips if not c.test], spec.sample_rate, spec.num_samples
    )
    heldout = load_waveforms(server_test_clips(corpus), spec.sample_rate, spec.num_samples)
    # a run on several workers shares its base folder; a run on one has no other worker to share with
    shared = (
        tmp_path_factory.getbasetemp().parent if worker_id != "master" else tmp_path_factory.mktemp("run")
    )
    folder, saved = shared / "fsdd-model", shared / "fsdd-model" / "weights.safetensors"
    with FileLock(str(shared / "fsdd-model.lock")):
        if not saved.is_file():
            folder.mkdir(exist_ok=True)
            trained = _train_fsdd_model(corpus, spec, waveforms, targets, heldout, folder)
            saved.write_bytes(weights.encode(trained))
    model = build_model(spec)
    set_arrays(model, weights.decode(saved.read_bytes())[0])
    calibration = waveforms[np.random.default_rng(0).choice(len(waveforms), 300, replace=False)]
    return TrainedModel(model.eval(), spec, labels, folder / "model.onnx", heldout, calibration)


def _train_fsdd_model(corpus, spec, waveforms, targets, heldout, folder: Path):
    """Train the CNN on FSDD's training clips and the bundled negatives, export it into folder (one file
    and its pair, its threshold calibrated on the held-out clips); its arrays.
    """
    import numpy as np
    import torch

    from fedspeech.export.onnx_export import export_onnx
    from fedspeech.models import build_model
    from fedspeech.models.calibration import calibrate_threshold
    from fedspeech.models.clips.datasets import bundled_data_dir, load_windows
    from fedspeech.models.train import get_arrays, train_local
    from fedspeech.protocol.labels import none_class, word_classes

    torch.manual_seed(0)
    labels = corpus.task.labels
    negatives = sorted((bundled_data_dir() / corpus.task.negatives[0]).glob("*.flac"))
    noise = np.concatenate([load_windows(f, spec.sample_rate, spec.num_samples, 1) for f in negatives])
    none = none_class(labels)
    model = build_model(spec)
    train_local(
        model,
        np.concatenate([waveforms, noise]),
        np.concatenate([targets, np.full(len(noise), none)]),
        epochs=6,
        batch_size=32,
        learning_rate=3e-3,
        noise=noise,
        none_class=none,
    )
    with torch.no_grad():  # the threshold calibrated on the held-out clips, as the coordinator's exports
        probabilities = torch.softmax(model.eval()(torch.from_numpy(heldout[0])), dim=1).numpy()
    threshold = calibrate_threshold(probabilities, heldout[1], word_classes(labels))
    export_onnx(
        model, spec, labels, folder / "model.onnx", round=1, task="fsdd", threshold=threshold, pair=True
    )
    return get_arrays(model)


@pytest.fixture
def virtual_microphone(tmp_path, monkeypatch):
    """A private PulseAudio server with a null sink, fedspeech_mic; its monitor is the default source."""
    if not (shutil.which("pulseaudio") and shutil.which("paplay") and shutil.which("pactl")):
        pytest.skip("needs PulseAudio: apt-get install pulseaudio pulseaudio-utils libasound2-plugins")
    runtime = tmp_path / "pulse"
    runtime.mkdir()
    env = {**os.environ, "PULSE_RUNTIME_PATH": str(runtime), "PULSE_STATE_PATH": str(runtime)}
    command = [
        "pulseaudio",
        "--daemonize=no",
        "-n",  # no default.pa: none of the machine's sound cards
        "--exit-idle-time=-1",
        "--load=module-native-protocol-unix auth-anonymous=1",
        "--load=module-null-sink sink_name=fedspeech_mic",
    ]
    with open(tmp_path / "pulseaudio.log", "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    try:
        ready = lambda: subprocess.run(["pactl", "info"], env=env, capture_output=True).returncode == 0  # noqa: E731
        wait_for(ready, 15, "PulseAudio to start")
        monkeypatch.setenv("PULSE_RUNTIME_PATH", str(runtime))
        monkeypatch.setenv("PULSE_SOURCE", "fedspeech_mic.monitor")  # what ALSA's "pulse" device records
        yield env
    finally:
        server.terminate()
        server.wait(timeout=10)
