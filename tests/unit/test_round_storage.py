"""Storing a round's model: the record, the files and the announcement agree, byte for byte."""

import time

import numpy as np

from fedspeech.coordinator.round.new_model import RoundTally, announcement, store_round
from fedspeech.coordinator.state.records import UpdateRecord
from fedspeech.coordinator.state.store import Store
from fedspeech.protocol import routes, weights
from tests.helpers.fake_fleet import FakeModel


def test_a_stored_round_is_announced_with_the_digests_and_sizes_of_the_files_served(tmp_path):
    store, model = Store(tmp_path / "state"), FakeModel(onnx_bytes=300)
    arrays = {"w": np.array([0.75, 0.0], np.float32)}
    update = UpdateRecord("pi3", 12, 0.5, 1.0, "ab" * 32)
    tally = RoundTally(time.time(), devices=3, updates=[update], bytes_up=7, bytes_down=9, stragglers=2)
    teacher = {"w": np.ones(2, np.float32)}

    record, teacher_at = store_round(store, model, 4, arrays, tally, teacher)

    assert (record.round, record.devices, record.results, record.stragglers) == (4, 3, 1, 2)
    assert (record.accuracy, record.bytes_up, record.bytes_down) == (0.75, 7, 9)
    assert store.rounds()[-1] == record and store.updates(4) == [update]
    stored = store.model_path(4, "weights").read_bytes()
    np.testing.assert_array_equal(weights.decode(stored)[0]["w"], arrays["w"])
    assert teacher_at is not None and teacher_at.path == routes.model(4, "teacher")
    served_teacher = store.model_path(4, "teacher").read_bytes()
    assert (teacher_at.sha256, teacher_at.size) == (weights.sha256(served_teacher), len(served_teacher))

    told = announcement(store, model, record, arrays)
    assert (told.round, told.metrics["accuracy"], told.labels) == (4, 0.75, model.labels)
    assert told.weights.path == routes.model(4, "weights")
    assert (told.weights.sha256, told.weights.size) == (weights.sha256(stored), len(stored))
    assert told.onnx is not None and told.onnx.size == 300 == store.model_path(4, "onnx").stat().st_size
    assert told.onnx.sha256 == weights.sha256(store.model_path(4, "onnx").read_bytes())

    assert store_round(store, model, 5, arrays, RoundTally(started=time.time()), None)[1] is None
