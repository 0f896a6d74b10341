"""The detection threshold calibrated on held-out clips, and where it is written: export, the coordinator."""

import numpy as np
import pytest

from fedspeech.coordinator.global_model import GlobalModel
from fedspeech.edge_client.onnx_model import OnnxModel
from fedspeech.export.onnx_export import export_onnx, update_onnx_weights
from fedspeech.models.calibration import HIGHEST, LOWEST, calibrate_threshold
from fedspeech.models.train import get_arrays
from fedspeech.protocol.labels import is_word
from fedspeech.protocol.messages import TaskDefinition

WORDS = [0, 1]  # of three classes; class 2 is "no word"


def rows(winning: list[float], labels: list[int], right: bool = True, classes: int = 3) -> np.ndarray:
    """Probabilities: the label's (or, if not right, the next class's) is winning, the rest share the rest."""
    probabilities = np.array([[(1 - p) / (classes - 1)] * classes for p in winning])
    for row, label, p in zip(probabilities, labels, winning, strict=True):
        row[label if right else (label + 1) % classes] = p
    return probabilities


def test_threshold_accepts_98_percent_of_the_right_word_clips():
    rng = np.random.default_rng(0)
    winning = list(rng.uniform(0.5, 1.0, 100))
    winning[17], winning[30], winning[45] = 0.4, 0.45, 0.47  # the three lowest
    labels = [i % 2 for i in range(100)]
    probabilities = np.concatenate(
        [
            rows(winning, labels),
            rows([0.9, 0.8], [0, 1], right=False),  # wrong: not accepted, whatever their probability
            rows([0.35, 0.36], [2, 2]),  # "no word" clips, right but not words
        ]
    )
    all_labels = np.array(labels + [0, 1, 2, 2])
    # 100 right word clips: 2 may fall below the threshold, so it is the third lowest
    assert calibrate_threshold(probabilities, all_labels, WORDS) == pytest.approx(0.47)
    # 50 of them: 1 may fall below it
    assert calibrate_threshold(probabilities[:50], all_labels[:50], WORDS) == pytest.approx(0.45)


def test_threshold_is_clamped():
    labels = np.array([0, 1] * 25)
    confident = rows([0.999] * 50, list(labels))
    assert calibrate_threshold(confident, labels, WORDS) == HIGHEST
    unsure = rows([0.28] * 50, list(labels), classes=4)
    assert calibrate_threshold(unsure, labels, WORDS) == LOWEST
    nothing_right = rows([0.9] * 50, list(labels), right=False)
    assert calibrate_threshold(nothing_right, labels, WORDS) == HIGHEST
    with pytest.raises(ValueError, match="do not match"):
        calibrate_threshold(confident, labels[:10], WORDS)


def test_export_writes_the_threshold(fsdd_model, tmp_path):
    path = export_onnx(
        fsdd_model.model, fsdd_model.spec, fsdd_model.labels, tmp_path / "a.onnx", threshold=0.7
    )
    assert OnnxModel(path).metadata["threshold"] == "0.7000"
    arrays = get_arrays(fsdd_model.model)
    updated = update_onnx_weights(path, arrays, tmp_path / "b.onnx", threshold=0.65)
    assert OnnxModel(updated).metadata["threshold"] == "0.6500"
    kept = update_onnx_weights(updated, arrays, tmp_path / "c.onnx", round=2)
    assert OnnxModel(kept).metadata["threshold"] == "0.6500"
    with pytest.raises(ValueError, match="probability"):
        update_onnx_weights(path, arrays, tmp_path / "d.onnx", threshold=1.5)


def test_coordinator_calibrates_with_a_held_out_set(fsdd_model, tmp_path):
    definition = TaskDefinition("fsdd", list(fsdd_model.labels), 8000, 1.0)
    arrays = get_arrays(fsdd_model.model)
    heldout = GlobalModel(fsdd_model.spec, definition, fsdd_model.heldout)
    (tmp_path / "heldout.onnx").write_bytes(heldout.to_onnx(arrays, round=1))
    threshold = float(OnnxModel(tmp_path / "heldout.onnx").metadata["threshold"])
    # the same, from the probabilities a device computes with the exported model
    waveforms, labels = fsdd_model.heldout
    probabilities = OnnxModel(fsdd_model.onnx_path).predict(waveforms)
    words = [i for i, label in enumerate(fsdd_model.labels) if is_word(label)]
    assert threshold == pytest.approx(calibrate_threshold(probabilities, labels, words), abs=2e-4)

    without = GlobalModel(fsdd_model.spec, definition, None)
    (tmp_path / "without.onnx").write_bytes(without.to_onnx(arrays, round=1))
    assert "threshold" not in OnnxModel(tmp_path / "without.onnx").metadata
