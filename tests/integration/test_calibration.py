"""The detection threshold calibrated on held-out clips, and where it is written: export, the coordinator."""

import numpy as np
import pytest

from fedspeech.coordinator.model.global_model import GlobalModel
from fedspeech.export.onnx_export import export_onnx, update_onnx_weights
from fedspeech.models.calibration import (
    BINS,
    HIGHEST,
    LOWEST,
    calibrate_threshold,
    decision_counts,
    threshold_of,
)
from fedspeech.models.train import get_arrays
from fedspeech.protocol.labels import word_classes
from fedspeech.protocol.messages import TaskDefinition
from fedspeech.runtime.session import OnnxModel, PairedModel

WORDS = [0, 1]  # of three classes; class 2 is "no word"


def rows(winning: list[float], labels: list[int], right: bool = True, classes: int = 3) -> np.ndarray:
    """Probabilities: the label's (or, if not right, the next class's) is winning, the rest share the rest."""
    probabilities = np.array([[(1 - p) / (classes - 1)] * classes for p in winning])
    for row, label, p in zip(probabilities, labels, winning, strict=True):
        row[label if right else (label + 1) % classes] = p
    return probabilities


def test_threshold_is_raised_only_past_more_wrong_decisions_than_chance_would_give():
    # right word decisions at 0.5 ... 0.95, wrong ones at 0.45, 0.6 and 0.9, and "no word" clips
    right = [0.5, 0.55, 0.62, 0.7, 0.8, 0.85, 0.92, 0.95]
    probabilities = np.concatenate(
        [
            rows(right, [i % 2 for i in range(len(right))]),
            rows([0.45, 0.6, 0.9], [0, 0, 0], right=False),  # wrong words heard: 1 for 0
            rows([0.99, 0.98], [2, 2]),  # "no word", right: no decision, whatever their probability
            rows([0.97], [1], right=False),  # a word heard as "no word": no decision
        ]
    )
    labels = np.array([i % 2 for i in range(len(right))] + [0, 0, 0, 2, 2, 1])
    # right taken less wrong taken: 8 - 3 = 5 from 0.3 (the lowest allowed), 6 just above 0.45: one wrong
    # decision more than right ones is well within chance (2 standard deviations of 1 decision: 2)
    assert calibrate_threshold(probabilities, labels, WORDS) == LOWEST
    # forty wrong decisions at 0.40 to 0.45 and forty right ones above 0.6: 40 more, where 2 x sqrt(40) =
    # 12.6 would be chance; raised past nearly all of them (the last few, by themselves, are within chance)
    many_wrong = rows(list(np.linspace(0.4, 0.449, 40)), [0] * 40, right=False)
    many_right = rows(list(np.linspace(0.6, 0.99, 40)), [1] * 40)
    both, both_labels = np.concatenate([many_wrong, many_right]), np.array([0] * 40 + [1] * 40)
    assert 0.43 < calibrate_threshold(both, both_labels, WORDS) <= 0.45
    # no wrong decision: every right one is taken, down to the lowest threshold allowed
    assert calibrate_threshold(probabilities[:8], labels[:8], WORDS) == LOWEST


def test_threshold_is_clamped():
    labels = np.array([0, 1] * 25)
    confident = rows([0.999] * 50, list(labels))
    wrong_but_sure = rows([0.97] * 30, [0] * 30, right=False)  # best just above 0.97: clamped
    both = np.concatenate([confident, wrong_but_sure])
    assert calibrate_threshold(both, np.append(labels, [0] * 30), WORDS) == HIGHEST
    few_wrong = np.concatenate([confident, wrong_but_sure[:3]])  # 3 of 53: within chance
    assert calibrate_threshold(few_wrong, np.append(labels, [0] * 3), WORDS) == LOWEST
    unsure = rows([0.28] * 50, list(labels), classes=4)
    assert calibrate_threshold(unsure, labels, WORDS) == LOWEST
    nothing_right = rows([0.9] * 50, list(labels), right=False)  # every word decision is rejected
    assert 0.9 < calibrate_threshold(nothing_right, labels, WORDS) == pytest.approx(0.9, abs=1.5 / BINS)
    no_word = rows([0.9] * 2, [2, 2])
    assert calibrate_threshold(no_word, np.array([2, 2]), WORDS) is None, "no word heard: no calibration"
    with pytest.raises(ValueError, match="do not match"):
        calibrate_threshold(confident, labels[:10], WORDS)


def test_counts_of_parts_add_up_to_the_threshold_of_their_union():
    rng = np.random.default_rng(0)
    winning = rng.uniform(0.34, 1.0, 400)
    labels = rng.integers(0, 3, 400)
    probabilities = np.concatenate(
        [rows(list(winning[:300]), list(labels[:300])), rows(list(winning[300:]), list(labels[300:]), False)]
    )
    parts = np.array_split(rng.permutation(400), 5)  # five devices' test clips
    counts = sum(decision_counts(probabilities[p], labels[p], WORDS) for p in parts)
    assert (counts == decision_counts(probabilities, labels, WORDS)).all()
    assert counts.sum() == np.isin(probabilities.argmax(axis=1), WORDS).sum()
    assert threshold_of(counts) == calibrate_threshold(probabilities, labels, WORDS)
    assert threshold_of(np.zeros((2, BINS), dtype=np.int64)) is None
    for bad in (np.zeros((2, BINS - 1)), -np.ones((2, BINS))):
        with pytest.raises(ValueError, match="decision counts"):
            threshold_of(bad)


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
    files = heldout.to_onnx(arrays, round=1)
    (tmp_path / "heldout.onnx").write_bytes(files.model)
    threshold = float(OnnxModel(tmp_path / "heldout.onnx").metadata["threshold"])
    assert files.pair is not None  # the pair is calibrated as the one file is
    assert PairedModel(*files.pair).metadata["threshold"] == OnnxModel(files.model).metadata["threshold"]
    for graph in (files.model, *files.pair):  # each names the task it was trained for
        assert OnnxModel(graph).metadata["task"] == "fsdd"
    # the same, from the probabilities a device computes with the exported model
    waveforms, labels = fsdd_model.heldout
    probabilities = OnnxModel(fsdd_model.onnx_path).predict(waveforms)
    words = word_classes(fsdd_model.labels)
    assert threshold == pytest.approx(calibrate_threshold(probabilities, labels, words), abs=2e-4)

    without = GlobalModel(fsdd_model.spec, definition, None)
    (tmp_path / "without.onnx").write_bytes(without.to_onnx(arrays, round=1).model)
    assert "threshold" not in OnnxModel(tmp_path / "without.onnx").metadata


def test_a_rounds_model_runs_over_the_held_out_set_once(fsdd_model, monkeypatch):
    """Evaluated, exported, then exported again with the devices' decisions: one pass of the held-out set."""
    from fedspeech.models import train

    passes = []
    predict = train.predict
    monkeypatch.setattr(train, "predict", lambda *args, **kw: passes.append(1) or predict(*args, **kw))
    definition = TaskDefinition("fsdd", list(fsdd_model.labels), 8000, 1.0)
    model = GlobalModel(fsdd_model.spec, definition, fsdd_model.heldout)
    arrays = get_arrays(fsdd_model.model)
    evaluation = model.evaluate(arrays)
    first, again = model.to_onnx(arrays, round=1), model.to_onnx(arrays, round=1)
    assert len(passes) == 1 and first == again
    waveforms, labels = fsdd_model.heldout
    assert (
        evaluation is not None
        and evaluation.accuracy == train.evaluate(fsdd_model.model, waveforms, labels).accuracy
    )
    other = {name: value * 0.5 for name, value in arrays.items()}
    model.evaluate(other)
    assert len(passes) == 3, "other weights are run again (and train.evaluate above ran once)"
