"""What the round loop needs from outside: a link to the devices and the model's operations.

The orchestrator is given these as small interfaces, so that it runs with fakes in tests: no broker,
no HTTP and no torch. `mqtt_link.CoordinatorLink` and `global_model.GlobalModel` are the real ones.
"""

from dataclasses import dataclass
from typing import Protocol

from fedspeech.models.calibration import Decisions
from fedspeech.protocol.messages import DeviceStatus, ModelAnnouncement, ModelSpec, Task, TaskDefinition
from fedspeech.protocol.weights import Arrays


@dataclass(frozen=True)
class Evaluation:
    """A global model's scores on the coordinator's own held-out set."""

    accuracy: float
    macro_f1: float
    loss: float


@dataclass(frozen=True)
class OnnxFiles:
    """A model exported for listeners: the one file, and the same model as two graphs (front-end and
    classifier, see protocol.onnx_metadata) where it can be split, else None.
    """

    model: bytes
    pair: tuple[bytes, bytes] | None = None


class DeviceLink(Protocol):
    """The control plane as the coordinator sees it: device statuses in, tasks and announcements out."""

    def statuses(self) -> dict[str, DeviceStatus]:
        """The latest status of every device heard from."""
        ...

    def online(self) -> list[str]:
        """Ids of devices whose latest status is not offline."""
        ...

    def publish_task(self, task: Task, device_id: str) -> None:
        """Send a device its task."""
        ...

    def clear_task(self, device_id: str) -> None:
        """Withdraw a device's task."""
        ...

    def announce(self, announcement: ModelAnnouncement) -> None:
        """Publish a new global model."""
        ...


class ModelOps(Protocol):
    """The operations on the global model: build, grow, evaluate, export."""

    spec: ModelSpec  # the full-grown model
    definition: TaskDefinition
    labels: list[str]
    start: Arrays | None  # the first model's weights where they are not fresh (--init)

    def spec_at(self, depth: int | None) -> ModelSpec:
        """The spec at a depth (the spec itself for a model that does not grow)."""
        ...

    def spec_of(self, arrays: Arrays) -> ModelSpec:
        """The spec of the model these arrays belong to."""
        ...

    def initial(self, seed: int, depth: int | None = None) -> Arrays:
        """Freshly initialised weights, the same for the same seed."""
        ...

    def grow(self, arrays: Arrays, depth: int, seed: int, new_blocks: str = "fresh") -> Arrays:
        """The arrays with new blocks added up to depth, started as new_blocks says (NEW_BLOCKS)."""
        ...

    def made_from(self, arrays: Arrays) -> str:
        """How a first model of these arrays was made, in words."""
        ...

    def evaluate(self, arrays: Arrays) -> Evaluation | None:
        """Scores on the coordinator's held-out set, or None without one."""
        ...

    def to_onnx(self, arrays: Arrays, round: int, devices: Decisions | None = None) -> OnnxFiles:
        """The model as ONNX files, its threshold calibrated with the devices' word decisions if given."""
        ...

    # what some methods need: FedBN the normalisation layers' names, quality-weighted aggregation a
    # validation set, mutual distillation the server's own data
    can_score: bool  # has a validation set, or takes clips devices share
    can_distil: bool  # has server data

    def norm_names(self) -> set[str]:
        """The names of the model's batch-normalisation arrays (empty for a model without them)."""
        ...

    def score(self, arrays: Arrays) -> float | None:
        """Accuracy on the coordinator's validation set, None while it holds no clips."""
        ...

    def distil(
        self,
        student: Arrays,
        teacher: Arrays,
        *,
        epochs: int,
        batch_size: int,
        learning_rate: float,
        temperature: float,
        seed: int,
    ) -> Arrays:
        """The student trained on the server's data towards the teacher's soft labels."""
        ...
