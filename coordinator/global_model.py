"""The coordinator's torch side: initial weights, held-out evaluation and ONNX export of a global model."""

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedspeech.protocol.messages import ModelSpec
from fedspeech.protocol.weights import Arrays

if TYPE_CHECKING:
    from fedspeech.export.onnx_export import Parity


@dataclass(frozen=True)
class Evaluation:
    """A global model's scores on the held-out set."""

    accuracy: float
    macro_f1: float
    loss: float


class GlobalModel:
    """Builds, evaluates and exports models of one spec; holds the held-out set."""

    def __init__(
        self,
        spec: ModelSpec,
        labels: Sequence[str],
        heldout: tuple[np.ndarray, np.ndarray] | None,
        task: str = "",
    ) -> None:
        import torch

        from fedspeech.models import build_model

        torch.set_num_threads(1)
        self.spec, self.labels, self.heldout, self.task = spec, list(labels), heldout, task
        self._model = build_model(spec)
        self._workdir = tempfile.TemporaryDirectory(prefix="fedspeech-onnx-")
        self._template: Path | None = None

    def initial(self, seed: int) -> Arrays:
        """Freshly initialised weights, the same for the same seed."""
        import torch

        from fedspeech.models import build_model
        from fedspeech.models.train import get_arrays

        torch.manual_seed(seed)
        return get_arrays(build_model(self.spec))

    def evaluate(self, arrays: Arrays) -> Evaluation | None:
        """Accuracy, macro-F1 and loss on the held-out set, or None without one."""
        from fedspeech.models.train import evaluate, set_arrays

        if self.heldout is None:
            return None
        set_arrays(self._model, arrays)
        result = evaluate(self._model, *self.heldout)
        return Evaluation(result.accuracy, result.macro_f1, result.loss)

    def to_onnx(self, arrays: Arrays, round: int) -> bytes:
        """The model as ONNX bytes, labels and round in its metadata."""
        from fedspeech.export.onnx_export import export_onnx, update_onnx_weights

        out = Path(self._workdir.name) / "model.onnx"
        if self._template is None:
            # Exporting takes over a second; later rounds only swap the weights of this graph.
            template = Path(self._workdir.name) / "template.onnx"
            self._template = export_onnx(self._model, self.spec, self.labels, template, task=self.task)
        return update_onnx_weights(self._template, arrays, out, round=round).read_bytes()

    def parity(self, arrays: Arrays, onnx_path: Path) -> "Parity":
        """How closely an ONNX file of these weights agrees with torch on the held-out set."""
        from fedspeech.export.onnx_export import parity
        from fedspeech.models.train import set_arrays

        set_arrays(self._model, arrays)
        return parity(self._model, onnx_path, self.heldout[0])
