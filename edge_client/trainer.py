"""Local training and evaluation on the device: the model for a spec, its weights in, results out.

torch is imported here and only here, lazily, so a device that only listens never loads it.
"""

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedspeech.edge_client.local_data import Split
from fedspeech.edge_client.local_norm import LocalNorm, lay_over
from fedspeech.models.objectives import Number, UnknownSetting, check_settings, terms_from_settings
from fedspeech.protocol import messages, weights
from fedspeech.protocol.labels import none_class, word_classes
from fedspeech.protocol.messages import EvaluationReport, ModelSpec, Task

log = logging.getLogger(__name__)

WARM_UP_SAMPLES = 32
WARM_UP_BATCH = 16  # the coordinator's default, so the first seconds per sample is comparable


# the settings the device honours around a run rather than in it: FedBN's and SiloBN's, 0 or 1
LOCAL_NORM = Number("local_norm", 0.0, 1.0)
LOCAL_STATISTICS = Number("local_statistics", 0.0, 1.0)
DEVICE_SETTINGS = (LOCAL_NORM, LOCAL_STATISTICS)


class TrainingStopped(Exception):
    """A training run ended between two batches: the device is stopping, or the task's deadline passed."""


@dataclass(frozen=True)
class TrainingSettings:
    """What a task's checked settings ask of the device around the run; its loss terms: terms_from_settings.

    local_norm: FedBN, the normalisation layers stay on the device; local_statistics: SiloBN, the device
    keeps the normalisation statistics of its own clips; report_counts: the upload carries the trained
    model's predicted class counts (FedVMR's class-distribution regulariser); distill: the task's teacher
    model is loaded for a Distillation term (mutual knowledge distillation).
    """

    local_norm: bool = False
    local_statistics: bool = False
    report_counts: bool = False
    distill: bool = False


def training_settings(task: Task) -> TrainingSettings:
    """The task's checked settings; UnknownSetting for one this device cannot honour.

    The settings it accepts are those of the loss terms (models.objectives) and DEVICE_SETTINGS.
    """
    config = task.config
    check_settings(config, task.spec.num_classes, task.teacher is not None, DEVICE_SETTINGS)
    return TrainingSettings(
        local_norm=_local_norm(config),
        local_statistics=_local_statistics(config),
        report_counts="prior_weight" in config,
        distill=task.teacher is not None,
    )


def _local_norm(config: Mapping[str, float | list[float]]) -> bool:
    """Whether the task asks the device to keep its normalisation layers (FedBN); UnknownSetting if bad."""
    return _flag(config, LOCAL_NORM)


def _local_statistics(config: Mapping[str, float | list[float]]) -> bool:
    """Whether the task asks the device to keep its clips' statistics (SiloBN); UnknownSetting if bad."""
    if _flag(config, LOCAL_STATISTICS):
        if _local_norm(config):
            raise UnknownSetting("local_statistics and local_norm together: the layers kept would be both")
        return True
    return False


def _flag(config: Mapping[str, float | list[float]], setting: Number) -> bool:
    """A 0/1 setting of the task, 0 when absent; UnknownSetting if it is not a number in [0, 1]."""
    value = config.get(setting.name, 0.0)
    setting.check(value)
    return bool(value)


class Trainer:
    """Builds the model once per spec and runs training and evaluation tasks on it.

    Setting stop (the daemon gives its own) ends a training run between two batches, as does the task's
    deadline: TrainingStopped. local_norm (the daemon gives the device's own) keeps the normalisation layers
    or statistics of tasks that ask for it (FedBN, SiloBN); without one, such tasks are refused.
    """

    def __init__(
        self, device_id: str, torch_threads: int = 1, *, local_norm: LocalNorm | None = None
    ) -> None:
        self.device_id, self.torch_threads = device_id, torch_threads
        self.stop = threading.Event()
        self.local_norm = local_norm
        self._model: tuple[ModelSpec, Any] | None = None
        self._teacher: tuple[ModelSpec, Any] | None = None

    def model(self, spec: ModelSpec) -> Any:
        """The model for a spec, built once and reused while the spec stays the same."""
        if self._model is None or self._model[0] != spec:
            self._model = (spec, self._build(spec))
        return self._model[1]

    def teacher(self, spec: ModelSpec, arrays: weights.Arrays) -> Any:
        """A model of the spec holding the teacher's arrays (built once per spec); WeightsError if unfit."""
        from fedspeech.models.train import get_arrays, set_arrays

        if self._teacher is None or self._teacher[0] != spec:
            self._teacher = (spec, self._build(spec))
        model = self._teacher[1]
        weights.check_like(arrays, get_arrays(model))
        set_arrays(model, arrays)
        return model

    def _build(self, spec: ModelSpec) -> Any:
        import torch

        from fedspeech.models import build_model

        torch.set_num_threads(self.torch_threads)
        return build_model(spec)

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

    def train(
        self, task: Task, arrays: weights.Arrays, train: Split, teacher: weights.Arrays | None = None
    ) -> tuple[Any, bytes]:
        """Train from the given weights on the local training split; return the result and the upload.

        teacher holds the server model's arrays when the task names one. Under local_norm the device's
        own normalisation arrays replace the task's, are kept after training and are left out of the
        upload. The split's negatives are the noise mixed into speech, and background windows train the
        task's none class. TrainingStopped if stop is set or the task's deadline passes before the last batch.
        """
        from fedspeech.models.losses import predicted_counts
        from fedspeech.models.train import Interrupted, get_arrays, train_local

        settings = training_settings(task)
        teacher_model = None
        if settings.distill:
            if teacher is None:
                raise ValueError("the task names a teacher model, and none was given")
            teacher_model = self.teacher(task.spec, teacher)
        terms = terms_from_settings(task.config, task.spec.num_classes, teacher_model, DEVICE_SETTINGS)
        model = self._load(task, arrays, settings.local_norm)
        try:
            result = train_local(
                model,
                train.waveforms,
                train.labels,
                epochs=task.epochs,
                batch_size=task.batch_size,
                learning_rate=task.learning_rate,
                seed=task.seed,
                terms=terms,
                should_stop=lambda: self.stop.is_set() or time.time() > task.deadline,
                noise=train.negatives,
                none_class=none_class(task.definition.labels),
            )
        except Interrupted:
            reason = "the device is stopping" if self.stop.is_set() else "its deadline passed during training"
            raise TrainingStopped(reason) from None
        metadata = {
            "task_id": task.task_id,
            "device_id": self.device_id,
            "num_samples": str(result.num_samples - train.mixed),  # synthetic takes are not its clips
            "train_loss": str(result.loss),
            "train_seconds": str(result.seconds),
            "seconds_per_sample": str(result.seconds_per_sample),
            "local_steps": str(result.steps),
        }
        if settings.report_counts:  # what the trained model predicts on its clips: counts, never labels
            counts = predicted_counts(model, train.waveforms, task.spec.num_classes)
            metadata["predicted_counts"] = json.dumps(counts.tolist())
        shared = self._shared(model, get_arrays(model), settings)
        return result, weights.encode(weights.with_precision(shared, task.precision), metadata)

    def evaluate(self, task: Task, arrays: weights.Arrays, test: Split, train: Split | None = None) -> bytes:
        """Evaluate the given weights on the local test split; return the report to upload (counts only)."""
        confusion, loss_sum, decisions = self.evaluation_counts(task, arrays, test, train)
        report = EvaluationReport(task.task_id, task.round, confusion.tolist(), loss_sum, decisions.tolist())
        return messages.encode(report)

    def evaluation_counts(
        self, task: Task, arrays: weights.Arrays, test: Split, train: Split | None = None
    ) -> tuple[np.ndarray, float, np.ndarray]:
        """Evaluate the given weights on the local test split: the confusion matrix, the summed loss, and
        the word decisions by confidence that calibrate the model's detection threshold.

        Under local_norm the device's own normalisation arrays replace the task's: the personalised model.
        Under local_statistics the normalisation statistics are taken again on the training split's clips
        at the task's weights, and kept: the device's model is the global one measured on its own voice.
        """
        from fedspeech.models.calibration import BINS, decision_counts
        from fedspeech.models.scores import confusion_matrix
        from fedspeech.models.train import predict

        local_norm, local_statistics = _local_norm(task.config), _local_statistics(task.config)
        num_classes = task.spec.num_classes
        confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
        decisions = np.zeros((2, BINS), dtype=np.int64)
        loss_sum = 0.0
        model = None
        if local_statistics and train is not None and len(train.waveforms):
            model = self._own_statistics(task, arrays, train)
        if len(test.labels):
            if model is None:
                model = self._load(task, arrays, local_norm)
            probabilities, losses = predict(model, test.waveforms, test.labels)
            confusion = confusion_matrix(test.labels, probabilities.argmax(axis=1), num_classes)
            decisions = decision_counts(probabilities, test.labels, word_classes(task.definition.labels))
            loss_sum = float(losses.sum())
        return confusion, loss_sum, decisions

    def _load(self, task: Task, arrays: weights.Arrays, local_norm: bool) -> Any:
        """The task's model holding its arrays, with the kept normalisation arrays over them if local_norm."""
        from fedspeech.models.norm import norm_names
        from fedspeech.models.train import get_arrays, set_arrays

        model = self.model(task.spec)
        weights.check_like(arrays, get_arrays(model))
        if local_norm:
            arrays = lay_over(arrays, self._norm_store().load(), norm_names(model))
        set_arrays(model, arrays)
        return model

    def _own_statistics(self, task: Task, arrays: weights.Arrays, train: Split) -> Any:
        """The task's model with normalisation statistics taken on the training clips, which are kept."""
        from fedspeech.models.norm import refresh_statistics, statistic_names
        from fedspeech.models.train import get_arrays

        model = self._load(task, arrays, local_norm=False)
        refresh_statistics(model, train.waveforms, task.batch_size)
        names, taken = statistic_names(model), get_arrays(model)
        if names:
            self._norm_store().save({name: taken[name] for name in names})
        return model

    def _shared(self, model: Any, trained: weights.Arrays, settings: TrainingSettings) -> weights.Arrays:
        """The arrays to upload, keeping here the normalisation arrays the task asks the device to keep.

        Under local_norm they are left out of the upload; under local_statistics (the statistics of the
        device's own clips, which train_local takes last) they are sent as well, so that the global model
        has statistics for a device without clips of its own.
        """
        from fedspeech.models.norm import norm_names, statistic_names

        if not (settings.local_norm or settings.local_statistics):
            if self.local_norm is not None:  # the model follows the global normalisation: a kept one is stale
                self.local_norm.forget()
            return trained
        store = self._norm_store()
        names = norm_names(model) if settings.local_norm else statistic_names(model)
        if not names:
            log.warning("the model has no batch normalisation layers to keep")
            store.forget()
            return trained
        store.save({name: trained[name] for name in names})
        if settings.local_statistics:
            return trained
        return {name: value for name, value in trained.items() if name not in names}

    def _norm_store(self) -> LocalNorm:
        """The device's kept normalisation layers; UnknownSetting if it has nowhere to keep them."""
        if self.local_norm is None:
            raise UnknownSetting(
                "local_norm: this device has no state folder to keep normalisation layers in"
            )
        return self.local_norm
