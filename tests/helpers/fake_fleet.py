"""A round loop over fakes: a model of two weights, devices that answer the moment a task is published,
and an orchestrator or an Uploads over a real store in a temporary folder. No broker, no HTTP, no torch."""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from fedspeech.coordinator.config import RoundConfig
from fedspeech.coordinator.refusals import NotWanted
from fedspeech.coordinator.round.evaluation_phase import EvaluationPhase
from fedspeech.coordinator.round.influence import SampleLimits
from fedspeech.coordinator.round.interfaces import Evaluation, OnnxFiles
from fedspeech.coordinator.round.orchestrator import Orchestrator
from fedspeech.coordinator.round.uploads import Uploads
from fedspeech.coordinator.state.store import Store
from fedspeech.coordinator.strategies import strategy_params
from fedspeech.models.calibration import Decisions
from fedspeech.protocol import weights
from fedspeech.protocol.messages import (
    DeviceStatus,
    ModelAnnouncement,
    ModelSpec,
    Profile,
    Task,
    TaskDefinition,
)
from fedspeech.protocol.weights import Arrays

DEFINITION = TaskDefinition("toy", ["a", "b"], 8000, 1.0)
SPEC = ModelSpec("toy", 8000, 8000, 2)


@dataclass
class FakeModel:
    """Two weights; the 'accuracy' of a model is its first weight, so aggregation shows in the scores."""

    spec: ModelSpec = SPEC
    definition: TaskDefinition = DEFINITION
    labels: list[str] = field(default_factory=lambda: list(DEFINITION.labels))
    onnx_bytes: int = 0  # the size of its "ONNX export", padded
    start: Arrays | None = None  # a trained first model: initial() gives it
    pair: bool = False  # exported as two graphs too

    def spec_at(self, depth: int | None) -> ModelSpec:
        return self.spec

    def spec_of(self, arrays: Arrays) -> ModelSpec:
        return self.spec

    def initial(self, seed: int, depth: int | None = None) -> Arrays:
        return dict(self.start) if self.start is not None else {"w": np.zeros(2, np.float32)}

    def grow(self, arrays: Arrays, depth: int, seed: int, new_blocks: str = "fresh") -> Arrays:
        return arrays

    def made_from(self, arrays: Arrays) -> str:
        return "random weights" if self.start is None else "the fake's start"

    def evaluate(self, arrays: Arrays) -> Evaluation:
        return Evaluation(float(arrays["w"][0]), 0.0, 1.0)

    def to_onnx(self, arrays: Arrays, round: int, devices: Decisions | None = None) -> OnnxFiles:
        calibrated = f", calibrated on {devices.on}" if devices is not None else ""
        model = f"onnx of round {round}{calibrated}".encode().ljust(self.onnx_bytes, b"\0")
        if not self.pair:
            return OnnxFiles(model)
        return OnnxFiles(model, (f"frontend of round {round}".encode(), b"classifier of " + model))


Responder = Callable[[Task], None]


@dataclass
class FakeLink:
    """Devices that answer a task the moment it is published (or never), through the orchestrator."""

    statuses_: dict[str, DeviceStatus] = field(default_factory=dict)
    responders: dict[str, Responder] = field(default_factory=dict)
    published: list[tuple[str, Task]] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    announced: list[ModelAnnouncement] = field(default_factory=list)

    def statuses(self) -> dict[str, DeviceStatus]:
        return dict(self.statuses_)

    def online(self) -> list[str]:
        return sorted(d for d, s in self.statuses_.items() if s.state != "offline")

    def publish_task(self, task: Task, device_id: str) -> None:
        self.published.append((device_id, task))
        if device_id in self.responders:
            try:
                self.responders[device_id](task)
            except NotWanted as exc:  # what a device hears as HTTP 409
                self.refused.append((device_id, str(exc)))

    def clear_task(self, device_id: str) -> None:
        self.cleared.append(device_id)

    def announce(self, announcement: ModelAnnouncement) -> None:
        self.announced.append(announcement)

    def tasks_of(self, round: int) -> dict[str, Task]:
        return {d: t for d, t in self.published if t.round == round and t.action == "train"}


def profile(gflops: float) -> Profile:
    return Profile(1, 1000.0, 512.0, gflops, 0.01 / gflops, 5.0)


class Fleet:
    """An orchestrator over a real store in a temporary folder, with fake devices."""

    def __init__(self, tmp_path, model: FakeModel | None = None, **config) -> None:
        defaults = {"min_devices": 2, "min_results": 1, "round_timeout": 0.3, "eval_every": 0}
        if isinstance(config.get("strategy_settings"), dict):  # name -> value, as an operator gives them
            config["strategy_settings"] = strategy_params(config["strategy"], config["strategy_settings"])
        self.config = RoundConfig(**{**defaults, **config})
        self.store = Store(tmp_path / "state")
        self.link = FakeLink()
        self.orchestrator = Orchestrator(self.config, self.store, self.link, model or FakeModel())
        self.uploads = self.orchestrator.uploads  # where the devices' uploads go

    def device(
        self,
        device_id: str,
        gflops: float = 1.0,
        value: float | None = 1.0,
        samples: int = 10,
        test_clips: int = 10,
    ) -> None:
        """A registered, online device that uploads weights of `value` everywhere (None: never answers),
        with test_clips test clips of each label.
        """
        test_counts = dict.fromkeys(DEFINITION.labels, test_clips)
        self.store.register_device(device_id, f"token-{device_id}", samples, {}, test_counts)
        self.link.statuses_[device_id] = DeviceStatus(device_id, "online", samples, profile(gflops))
        if value is not None:
            self.link.responders[device_id] = lambda task: self.upload(device_id, task, value, samples)

    def upload(self, device_id: str, task: Task, value: float, samples: int | str = 10) -> None:
        if task.action != "train":
            return
        body = weights.encode(
            {"w": np.full(2, value, np.float32)}, {"task_id": task.task_id, "num_samples": str(samples)}
        )
        self.uploads.receive_update(task.round, device_id, body, weights.sha256(body))

    @contextmanager
    def running(self) -> Iterator[threading.Event]:
        stop = threading.Event()
        thread = threading.Thread(target=self.orchestrator.run, args=(stop,), daemon=True)
        thread.start()
        try:
            yield stop
        finally:
            stop.set()
            thread.join(10)

    def finish(self, timeout: float = 10.0) -> None:
        with self.running():
            assert self.orchestrator.finished.wait(timeout), "rounds did not finish"


def uploads_of(tmp_path, link: FakeLink | None = None) -> Uploads:
    """An uploads on round 0's model, with devices a, b and c registered and online, each with 10 samples."""
    link = link or FakeLink()
    store = Store(tmp_path / "state")
    for device in ("a", "b", "c"):
        link.statuses_[device] = DeviceStatus(device, "online", 10, profile(1.0))
        store.register_device(device, f"token-{device}", 10, {})
    evaluation = EvaluationPhase(store, link, DEFINITION.labels, 1)
    limits = SampleLimits(growth=0.25, over_median=3.0, most=100)
    uploads = Uploads(store, link, evaluation, spec=SPEC, local_names=frozenset(), limits=limits)
    uploads.publish({"w": np.zeros(2, np.float32)}, SPEC)
    return uploads
