"""The coordinator's torch side: initial and grown weights, held-out evaluation and ONNX export."""

import logging
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedspeech.coordinator.model.pretraining import RANDOM_WORDS
from fedspeech.coordinator.round.interfaces import Evaluation, OnnxFiles
from fedspeech.models.calibration import Decisions, calibrate, decision_counts
from fedspeech.protocol import onnx_metadata as meta
from fedspeech.protocol import weights
from fedspeech.protocol.labels import word_classes
from fedspeech.protocol.messages import ModelSpec, TaskDefinition
from fedspeech.protocol.weights import Arrays

if TYPE_CHECKING:
    from fedspeech.coordinator.fleet.shared_validation import SharedValidation
    from fedspeech.export.onnx_export import Parity


log = logging.getLogger(__name__)

Clips = tuple[np.ndarray, np.ndarray]  # waveforms (N, num_samples) and labels (N,)


class GlobalModel:
    """Builds, grows, evaluates and exports models of one spec; holds the coordinator's own clips.

    spec is the full-grown model; a transformer's arrays may hold fewer blocks, and every method works
    at the depth the arrays have. heldout scores each global model; validation scores each update (for
    quality-weighted aggregation); server_data trains mutual distillation's server model, its labels
    None where the clips are unlabelled.
    """

    def __init__(
        self,
        spec: ModelSpec,
        definition: TaskDefinition,
        heldout: Clips | None,
        validation: Clips | None = None,
        server_data: tuple[np.ndarray, np.ndarray | None] | None = None,
        shared_validation: "SharedValidation | None" = None,
    ) -> None:
        import torch

        torch.set_num_threads(1)
        self.spec, self.definition, self.heldout = spec, definition, heldout
        self.validation, self.server_data, self.shared_validation = validation, server_data, shared_validation
        self.can_score = validation is not None or shared_validation is not None
        self.can_distil = server_data is not None
        self.labels, self.task, self.say = list(definition.labels), definition.name, dict(definition.say)
        self._workdir = tempfile.TemporaryDirectory(prefix="fedspeech-onnx-")
        self._predicted: tuple[str, np.ndarray, np.ndarray] | None = None  # weights' digest, held-out output
        self._models: dict[ModelSpec, Any] = {}
        self.start: Arrays | None = None  # the first model's weights, where they are not fresh (--init)
        self.start_made_from = RANDOM_WORDS  # how start was made, in words (init_in_words)
        self._templates: dict[ModelSpec, dict[str, Path]] = {}  # by kind: "model", frontend, classifier

    def spec_at(self, depth: int | None) -> ModelSpec:
        """The spec of this model at a depth (the spec itself for a model that does not grow)."""
        return self.spec if self.spec.depth is None else replace(self.spec, depth=depth)

    def spec_of(self, arrays: Arrays) -> ModelSpec:
        """The spec of the model these arrays belong to: its depth is the number of blocks they hold."""
        from fedspeech.models import depth_of

        return self.spec_at(depth_of(arrays))

    def initial(self, seed: int, depth: int | None = None) -> Arrays:
        """The start's weights, where they are of that depth; else freshly initialised weights at a depth
        (default: full-grown), the same for the same seed.
        """
        import torch

        if self.start is not None and self.spec_of(self.start) == self.spec_at(depth):
            return dict(self.start)

        from fedspeech.models import build_model
        from fedspeech.models.train import get_arrays

        torch.manual_seed(seed)
        return get_arrays(build_model(self.spec if depth is None else self.spec_at(depth)))

    def made_from(self, arrays: Arrays) -> str:
        """How a first model of these arrays was made, in words: as start was, where it is start's depth."""
        fresh = self.start is None or self.spec_of(self.start) != self.spec_of(arrays)
        return RANDOM_WORDS if fresh else self.start_made_from

    def grow(self, arrays: Arrays, depth: int, seed: int, new_blocks: str = "fresh") -> Arrays:
        """The arrays with new blocks added up to depth; the trained ones kept."""
        from fedspeech.models.growth import grow

        return grow(arrays, self.spec_at(depth), seed, new_blocks)

    def _model(self, arrays: Arrays) -> Any:
        """A model of the arrays' spec holding them; one is built per depth and reused."""
        from fedspeech.models import build_model
        from fedspeech.models.train import set_arrays

        spec = self.spec_of(arrays)
        if spec not in self._models:
            self._models[spec] = build_model(spec)
        set_arrays(self._models[spec], arrays)
        return self._models[spec]

    def evaluate(self, arrays: Arrays) -> Evaluation | None:
        """Accuracy, macro-F1 and loss on the held-out set, or None without one."""
        from fedspeech.models.train import scored

        if self.heldout is None:
            return None
        result = scored(*self._heldout_predictions(arrays), self.heldout[1])
        return Evaluation(result.accuracy, result.macro_f1, result.loss)

    def _heldout_predictions(self, arrays: Arrays) -> tuple[np.ndarray, np.ndarray]:
        """The held-out probabilities and losses of these weights, computed once for the same weights: a
        round's model is evaluated, exported, and exported again once the devices have evaluated it.
        """
        from fedspeech.models.train import predict

        assert self.heldout is not None
        digest = weights.sha256(weights.encode(arrays))
        if self._predicted is None or self._predicted[0] != digest:
            self._predicted = (digest, *predict(self._model(arrays), *self.heldout))
        return self._predicted[1], self._predicted[2]

    def norm_names(self) -> set[str]:
        """The names of the model's batch-normalisation arrays, which FedBN keeps on the devices."""
        from fedspeech.models import build_model
        from fedspeech.models.norm import norm_names

        return norm_names(build_model(self.spec))

    def score(self, arrays: Arrays) -> float | None:
        """Accuracy on the coordinator's own validation clips and those devices shared; None if none."""
        from fedspeech.models.train import evaluate

        parts = [self.validation, self.shared_validation.clips() if self.shared_validation else None]
        present = [p for p in parts if p is not None]
        if not present:
            return None
        waveforms, labels = (np.concatenate([p[i] for p in present]) for i in (0, 1))
        return evaluate(self._model(arrays), waveforms, labels).accuracy

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
        """The student trained on the server data towards the teacher's soft labels (and any labels)."""
        import torch

        from fedspeech.models import build_model
        from fedspeech.models.objectives import Distillation
        from fedspeech.models.train import get_arrays, set_arrays, train_local

        if self.server_data is None:
            raise ValueError("no server data")
        teacher_model = self._model(teacher)  # a teacher's parameters never change while it teaches
        model = build_model(self.spec_of(student))
        set_arrays(model, student)
        torch.manual_seed(seed)
        waveforms, labels = self.server_data
        train_local(
            model,
            waveforms,
            labels,
            epochs=epochs,
            batch_size=batch_size,
            learning_rate=learning_rate,
            seed=seed,
            terms=[Distillation(1.0, teacher_model, temperature)],
        )
        return get_arrays(model)

    def to_onnx(self, arrays: Arrays, round: int, devices: Decisions | None = None) -> OnnxFiles:
        """The model as ONNX files, one and a pair: labels, round, and its threshold calibrated on the
        held-out set and the devices' decisions (their latest evaluation's), if any, with where it came from.
        """
        from fedspeech.export.onnx_export import update_onnx_weights

        spec = self.spec_of(arrays)
        if spec not in self._templates:
            # Exporting takes seconds; later rounds at this depth only swap the graphs' weights.
            self._templates[spec] = self._export_templates(arrays, spec)
        parts = [part for part in (self.heldout_decisions(arrays), devices) if part is not None]
        threshold, source = calibrate(parts)
        files = []
        for kind, template in self._templates[spec].items():
            out = Path(self._workdir.name) / f"{kind}.onnx"
            # the front-end has no weights: only its metadata changes
            given = {} if kind == meta.FRONTEND else arrays
            update_onnx_weights(template, given, out, round=round, threshold=threshold, threshold_from=source)
            files.append(out.read_bytes())
        return OnnxFiles(files[0], (files[1], files[2]) if len(files) == 3 else None)

    def _export_templates(self, arrays: Arrays, spec: ModelSpec) -> dict[str, Path]:
        """The ONNX templates of a spec by kind: the one file ('model'), and its pair where it splits;
        kept from one run to the next (template_cache).
        """
        from fedspeech.export.template_cache import kept_templates, template_key

        key = template_key(spec, self.labels, self.task, self.say)
        fallback = Path(self._workdir.name) / f"templates-{spec.depth}"
        return kept_templates(key, lambda folder: self._exported(arrays, spec, folder), fallback)

    def _exported(self, arrays: Arrays, spec: ModelSpec, folder: Path) -> dict[str, Path]:
        """Export the ONNX templates of a spec into folder, by kind."""
        from fedspeech.export.onnx_export import export_classifier, export_frontend, export_onnx

        model, task, say = self._model(arrays), self.task, self.say
        one_file = export_onnx(model, spec, self.labels, folder / "model.onnx", task=task, say=say)
        templates = {"model": one_file}
        try:
            path = folder / "frontend.onnx"
            frontend = export_frontend(model, spec, self.labels, path, task=task, say=say)
        except ValueError as exc:  # a model without a LogMel front-end travels as one file
            log.info("the model travels as one ONNX file only: %s", exc)
            return templates
        path = folder / "classifier.onnx"
        classifier = export_classifier(model, spec, self.labels, path, task=task, say=say)
        return templates | {meta.FRONTEND: frontend, meta.CLASSIFIER: classifier}

    def heldout_decisions(self, arrays: Arrays) -> Decisions | None:
        """The model's word decisions on the held-out set (None without one)."""
        if self.heldout is None:
            return None
        probabilities, _ = self._heldout_predictions(arrays)
        counts = decision_counts(probabilities, self.heldout[1], word_classes(self.labels))
        return Decisions(counts, f"{len(self.heldout[1])} held-out clips")

    def parity(self, arrays: Arrays, onnx_path: Path) -> "Parity":
        """How closely an ONNX file of these weights agrees with torch on the held-out set."""
        from fedspeech.export.onnx_export import parity

        if self.heldout is None:
            raise ValueError("no held-out set to check parity on")
        return parity(self._model(arrays), onnx_path, self.heldout[0])
