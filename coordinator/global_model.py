"""The coordinator's torch side: initial and grown weights, held-out evaluation and ONNX export."""

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedspeech.coordinator.ports import Evaluation
from fedspeech.protocol.messages import ModelSpec, TaskDefinition
from fedspeech.protocol.weights import Arrays

if TYPE_CHECKING:
    from fedspeech.export.onnx_export import Parity


class GlobalModel:
    """Builds, grows, evaluates and exports models of one spec; holds the held-out set.

    spec is the full-grown model; a transformer's arrays may hold fewer blocks, and every method works
    at the depth the arrays have.
    """

    def __init__(
        self, spec: ModelSpec, definition: TaskDefinition, heldout: tuple[np.ndarray, np.ndarray] | None
    ) -> None:
        import torch

        torch.set_num_threads(1)
        self.spec, self.definition, self.heldout = spec, definition, heldout
        self.labels, self.task = list(definition.labels), definition.name
        self._workdir = tempfile.TemporaryDirectory(prefix="fedspeech-onnx-")
        self._models: dict[ModelSpec, Any] = {}
        self._templates: dict[ModelSpec, Path] = {}

    def spec_at(self, depth: int | None) -> ModelSpec:
        """The spec of this model at a depth (the spec itself for a model that does not grow)."""
        return self.spec if self.spec.depth is None else replace(self.spec, depth=depth)

    def spec_of(self, arrays: Arrays) -> ModelSpec:
        """The spec of the model these arrays belong to: its depth is the number of blocks they hold."""
        from fedspeech.models import depth_of

        return self.spec_at(depth_of(arrays))

    def initial(self, seed: int, depth: int | None = None) -> Arrays:
        """Freshly initialised weights at a depth (default: full-grown), the same for the same seed."""
        import torch

        from fedspeech.models import build_model
        from fedspeech.models.train import get_arrays

        torch.manual_seed(seed)
        return get_arrays(build_model(self.spec if depth is None else self.spec_at(depth)))

    def grow(self, arrays: Arrays, depth: int, seed: int) -> Arrays:
        """The arrays with new blocks added up to depth; the trained ones kept."""
        from fedspeech.models.growth import grow

        return grow(arrays, self.spec_at(depth), seed)

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
        from fedspeech.models.train import evaluate

        if self.heldout is None:
            return None
        result = evaluate(self._model(arrays), *self.heldout)
        return Evaluation(result.accuracy, result.macro_f1, result.loss)

    def to_onnx(self, arrays: Arrays, round: int) -> bytes:
        """The model as ONNX bytes, labels and round in its metadata."""
        from fedspeech.export.onnx_export import export_onnx, update_onnx_weights

        spec = self.spec_of(arrays)
        out = Path(self._workdir.name) / "model.onnx"
        if spec not in self._templates:
            # Exporting takes over a second; later rounds at this depth only swap the graph's weights.
            template = Path(self._workdir.name) / f"template-{spec.depth}.onnx"
            model = self._model(arrays)
            self._templates[spec] = export_onnx(model, spec, self.labels, template, task=self.task)
        return update_onnx_weights(self._templates[spec], arrays, out, round=round).read_bytes()

    def parity(self, arrays: Arrays, onnx_path: Path) -> "Parity":
        """How closely an ONNX file of these weights agrees with torch on the held-out set."""
        from fedspeech.export.onnx_export import parity

        if self.heldout is None:
            raise ValueError("no held-out set to check parity on")
        return parity(self._model(arrays), onnx_path, self.heldout[0])
