"""Local training and evaluation on the device: the model for a spec, its weights in, results out.

torch is imported here and only here, lazily, so a device that only listens never loads it.
"""

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedspeech.edge_client.local_data import Split
from fedspeech.protocol import messages, weights
from fedspeech.protocol.messages import EvaluationReport, ModelSpec, Task

log = logging.getLogger(__name__)

WARM_UP_SAMPLES = 32
WARM_UP_BATCH = 16  # the coordinator's default, so the first seconds per sample is comparable


# the training settings a strategy may send, with the values a device accepts
SETTINGS: dict[str, tuple[float, float]] = {"proximal_mu": (0.0, 100.0)}


class UnknownSetting(ValueError):
    """A task asks for a training setting this device does not know or does not accept."""


class TrainingStopped(Exception):
    """A training run ended between two batches: the device is stopping, or the task's deadline passed."""


def training_settings(config: Mapping[str, float]) -> dict[str, float]:
    """The task's settings as train_local's keyword arguments; UnknownSetting for one it cannot honour."""
    for name, value in config.items():
        if name not in SETTINGS:
            raise UnknownSetting(f"unknown training setting {name!r} (known: {', '.join(SETTINGS)})")
        low, high = SETTINGS[name]
        if not low <= value <= high:
            raise UnknownSetting(f"training setting {name} = {value} is outside [{low}, {high}]")
    return dict(config)


class Trainer:
    """Builds the model once per spec and runs training and evaluation tasks on it.

    Setting stop (the daemon gives its own) ends a training run between two batches, as does the task's
    deadline: TrainingStopped.
    """

    def __init__(self, device_id: str, torch_threads: int = 1) -> None:
        self.device_id, self.torch_threads = device_id, torch_threads
        self.stop = threading.Event()
        self._model: tuple[ModelSpec, Any] | None = None

    def model(self, spec: ModelSpec) -> Any:
        """The model for a spec, built once and reused while the spec stays the same."""
        if self._model is None or self._model[0] != spec:
            import torch

            from fedspeech.models import build_model

            torch.set_num_threads(self.torch_threads)
            self._model = (spec, build_model(spec))
        return self._model[1]

    def warm_up(self, spec: ModelSpec, train: Split) -> float | None:
        """Load torch and the model and train briefly on a few clips; return a first seconds per sample.

        A slow device spends a minute here; done before registering, it is not charged to its first round.
        The figure is the second of two passes, so one-off allocation is not counted.
        """
        from fedspeech.models.train import Interrupted, train_local

        if len(train.labels) == 0:
            return None
        model = self.model(spec)
        few = slice(0, WARM_UP_SAMPLES)
        for _ in range(2):
            try:
                result = train_local(
                    model,
                    train.waveforms[few],
                    train.labels[few],
                    epochs=1,
                    batch_size=WARM_UP_BATCH,
                    learning_rate=0.0,
                    should_stop=self.stop.is_set,
                )
            except Interrupted:
                return None
        log.info("warmed up: %.4f s per training sample", result.seconds_per_sample)
        return result.seconds_per_sample

    def train(self, task: Task, arrays: weights.Arrays, train: Split) -> tuple[Any, bytes]:
        """Train from the given weights on the local training split; return the result and the upload.

        TrainingStopped if stop is set or the task's deadline passes before the last batch.
        """
        from fedspeech.models.train import Interrupted, get_arrays, set_arrays, train_local

        model = self.model(task.spec)
        weights.check_like(arrays, get_arrays(model))
        set_arrays(model, arrays)
        try:
            result = train_local(
                model,
                train.waveforms,
                train.labels,
                epochs=task.epochs,
                batch_size=task.batch_size,
                learning_rate=task.learning_rate,
                seed=task.seed,
                should_stop=lambda: self.stop.is_set() or time.time() > task.deadline,
                **training_settings(task.config),
            )
        except Interrupted:
            reason = "the device is stopping" if self.stop.is_set() else "its deadline passed during training"
            raise TrainingStopped(reason) from None
        metadata = {
            "task_id": task.task_id,
            "device_id": self.device_id,
            "num_samples": str(result.num_samples),
            "train_loss": str(result.loss),
            "train_seconds": str(result.seconds),
            "seconds_per_sample": str(result.seconds_per_sample),
        }
        return result, weights.encode(get_arrays(model), metadata=metadata)

    def evaluate(self, task: Task, arrays: weights.Arrays, test: Split) -> bytes:
        """Evaluate the given weights on the local test split; return the report to upload (counts only)."""
        from fedspeech.models.metrics import confusion_matrix
        from fedspeech.models.train import get_arrays, predict, set_arrays

        num_classes = task.spec.num_classes
        confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
        loss_sum = 0.0
        if len(test.labels):
            model = self.model(task.spec)
            weights.check_like(arrays, get_arrays(model))
            set_arrays(model, arrays)
            predictions, losses = predict(model, test.waveforms, test.labels)
            confusion = confusion_matrix(test.labels, predictions, num_classes)
            loss_sum = float(losses.sum())
        report = EvaluationReport(task.task_id, task.round, confusion.tolist(), loss_sum)
        return messages.encode(report)
