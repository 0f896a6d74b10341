"""The tasks devices are handed: pure, with a real store."""

import numpy as np
import pytest

from fedspeech.coordinator.config import RoundConfig
from fedspeech.coordinator.round import device_tasks
from fedspeech.coordinator.state.records import RoundRecord
from fedspeech.coordinator.state.store import Store
from fedspeech.coordinator.strategies import STRATEGIES, RoundPlan, Work
from fedspeech.protocol import routes, weights
from fedspeech.protocol.messages import BlobRef, ModelSpec, TaskDefinition

ARRAYS = {"w": np.linspace(-1, 1, 64, dtype=np.float32), "b": np.ones(3, np.float32)}
MODEL = BlobRef(routes.model(0, "weights"), "0" * 64, 10)
SPEC = ModelSpec("cnn", 8000, 8000, 2)
DEFINITION = TaskDefinition("t", ["yes", "no"], 8000, 1.0)


def stored(tmp_path) -> Store:
    """A store holding round 0 with ARRAYS as its global model."""
    store = Store(tmp_path)
    blob = weights.encode(ARRAYS, {"round": "0"})
    store.save_round(
        RoundRecord(0, 0.0, 0.0, 0.0, 0, 0, None, None, None, 0, 0, weights.sha256(blob)), blob, None, []
    )
    return store


def test_each_device_trains_its_planned_work_with_a_seed_of_its_own():
    plan = RoundPlan({"a": Work(2, {"mu": 0.1}), "b": Work(1)}, needed=2)
    config = RoundConfig(seed=3)
    a, b = (device_tasks.training(config, 5, plan, d) for d in ("a", "b"))
    assert (a["epochs"], a["config"], b["epochs"], b["config"]) == (2, {"mu": 0.1}, 1, {})
    assert a["upload_path"] == b["upload_path"] == routes.updates(5)
    seeds = {a["seed"], b["seed"], device_tasks.training(config, 6, plan, "a")["seed"]}
    assert len(seeds) == 3, "no two devices and no two rounds share a seed"


def test_an_evaluation_asks_for_the_personalised_model_only_with_personal_settings():
    plain = device_tasks.evaluation(4, STRATEGIES["fedavg"](1, 1).personal)
    assert plain == {"upload_path": routes.evaluations(4), "epochs": 1, "action": "evaluate"}
    local = device_tasks.evaluation(4, STRATEGIES["fedbn"](1, 1).personal)
    assert local == {**plain, "config": {"local_norm": 1.0}}
    own = device_tasks.evaluation(4, STRATEGIES["silobn"](1, 1).personal)
    assert own == {**plain, "config": {"local_statistics": 1.0}}


def test_only_training_tasks_carry_the_teacher_and_every_task_has_a_fresh_id():
    teacher = BlobRef(routes.model(0, "teacher"), "1" * 64, 10)
    work = {"a": {"upload_path": "u", "epochs": 1}, "b": device_tasks.evaluation(0, {})}
    config = RoundConfig(batch_size=8, precision="float16")
    tasks = device_tasks.make_tasks(
        1, 99.0, work, model=MODEL, spec=SPEC, definition=DEFINITION, config=config,
        learning_rate=0.01, teacher=teacher,
    )  # fmt: skip
    assert tasks["a"].teacher == teacher and tasks["b"].teacher is None
    assert tasks["b"].action == "evaluate" and tasks["a"].action == "train"
    assert {t.batch_size for t in tasks.values()} == {8} and tasks["a"].precision == "float16"
    assert tasks["a"].task_id != tasks["b"].task_id


def test_the_float16_copy_is_written_once_and_its_digest_is_of_the_bytes_served(tmp_path):
    with pytest.raises(RuntimeError):
        device_tasks.latest_weights(Store(tmp_path / "empty"), "float32", ARRAYS)
    store = stored(tmp_path)
    full = device_tasks.latest_weights(store, "float32", ARRAYS)
    assert full.sha256 == weights.sha256(store.model_path(0, "weights").read_bytes())
    half = device_tasks.latest_weights(store, "float16", ARRAYS)
    path = store.model_path(0, "float16")
    assert half.sha256 == weights.sha256(path.read_bytes()) and half.size == path.stat().st_size
    assert half.size < full.size
    assert weights.decode(path.read_bytes())[0]["w"].dtype == np.float16
    written = path.stat().st_mtime_ns
    assert device_tasks.latest_weights(store, "float16", ARRAYS) == half
    assert path.stat().st_mtime_ns == written
