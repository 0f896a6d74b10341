"""The device side of FedBN, SiloBN, FedVMR's class-distribution regulariser and mutual distillation.

Tiny models (0.25 s clips at 8 kHz) on a few random waveforms: the trainer, the kept normalisation
layers, the settings a task may carry, and the personalised ONNX model the keeper writes.
"""

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedspeech.edge_client.local_data import Split
from fedspeech.edge_client.local_norm import NORM_FILE, LocalNorm, lay_over
from fedspeech.edge_client.model_keeper import KEPT_MODEL, ModelKeeper
from fedspeech.edge_client.trainer import DEVICE_SETTINGS, Trainer, UnknownSetting, training_settings
from fedspeech.models.objectives import ClassPrior, Proximal, TimeBudget, terms_from_settings
from fedspeech.protocol import messages, weights
from fedspeech.protocol.messages import (
    BlobRef,
    EvaluationReport,
    ModelAnnouncement,
    ModelSpec,
    Task,
    TaskDefinition,
)
from fedspeech.protocol.weights import Arrays
from tests.helpers.device_models import SPEC, TEACHER, fresh, initializers, names_of_norm, uploaded

LABELS = [str(i) for i in range(10)]
DEFINITION = TaskDefinition("digits", LABELS, 8000, 0.25)
SKEWED = [0.5] + [0.5 / 9] * 9  # a population that mostly says "0"


def split(clips: int, seed: int) -> Split:
    """Random waveforms with every label present."""
    rng = np.random.default_rng(seed)
    waveforms = rng.normal(0.0, 0.1, (clips, SPEC.num_samples)).astype(np.float32)
    labels = np.arange(clips) % SPEC.num_classes
    return Split(waveforms, labels, {label: int((labels == i).sum()) for i, label in enumerate(LABELS)})


TRAIN, TEST = split(24, seed=1), split(20, seed=2)


def make_task(config: dict[str, Any] | None = None, **changes: Any) -> Task:
    task = Task(
        task_id="task-1",
        round=1,
        spec=SPEC,
        definition=DEFINITION,
        weights=BlobRef("/api/models/0/weights", "0" * 64, 1),
        upload_path="/api/rounds/1/updates",
        epochs=2,
        batch_size=8,
        learning_rate=1e-2,
        deadline=time.time() + 600,
        seed=3,
        config=config or {},
    )
    return replace(task, **changes)


def names_of_statistics(spec: ModelSpec = SPEC) -> set[str]:
    from fedspeech.models import build_model
    from fedspeech.models.norm import statistic_names

    return statistic_names(build_model(spec))


def shifted(arrays: Arrays, names: set[str], by: float = 0.5) -> Arrays:
    """The named arrays moved away from their values (variances kept positive)."""
    return {name: (np.abs(arrays[name]) + by).astype(arrays[name].dtype) for name in names}


def report(body: bytes) -> EvaluationReport:
    return messages.decode(body, EvaluationReport)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def start() -> Arrays:
    return fresh()


# FedBN


def test_under_local_norm_the_upload_lacks_exactly_the_norm_arrays(state: Path, start: Arrays) -> None:
    norm = names_of_norm()
    assert norm and norm < start.keys()
    trainer = Trainer("d1", local_norm=LocalNorm(state))
    _, body = trainer.train(make_task({"local_norm": 1.0}), start, TRAIN)
    sent, _ = uploaded(body)
    assert sent.keys() == start.keys() - norm
    assert any(not np.array_equal(sent[name], start[name]) for name in sent)  # it did train
    kept = LocalNorm(state).load()
    assert kept is not None and kept.keys() == norm
    assert any(not np.array_equal(kept[name], start[name]) for name in norm)  # its own, trained


def test_without_local_norm_everything_is_uploaded_and_nothing_kept(state: Path, start: Arrays) -> None:
    trainer = Trainer("d1", local_norm=LocalNorm(state))
    LocalNorm(state).save(shifted(start, names_of_norm()))  # kept from an earlier FedBN run
    _, body = trainer.train(make_task(), start, TRAIN)
    assert uploaded(body)[0].keys() == start.keys()
    assert LocalNorm(state).load() is None, "a model that follows the global norm keeps no stale copy"


def test_kept_norm_survives_a_restart_and_is_laid_over_the_next_task(
    state: Path, start: Arrays, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedspeech.models import train as train_module
    from fedspeech.models.train import TrainResult, get_arrays

    norm = names_of_norm()
    Trainer("d1", local_norm=LocalNorm(state)).train(make_task({"local_norm": 1.0}), start, TRAIN)
    kept = LocalNorm(state).load()
    assert kept is not None
    seen: dict[str, Arrays] = {}

    def no_training(model: Any, *args: Any, **kwargs: Any) -> TrainResult:
        seen["start"] = get_arrays(model)
        return TrainResult(len(TRAIN.labels), 1.0, 0.1, 0.01)

    monkeypatch.setattr(train_module, "train_local", no_training)
    restarted = Trainer("d1", local_norm=LocalNorm(state))  # a new process on the same state folder
    task_weights = fresh(seed=7)
    _, body = restarted.train(make_task({"local_norm": 1.0}), task_weights, TRAIN)
    for name in norm:
        assert not np.array_equal(kept[name], task_weights[name])  # trained, so not the task's
        np.testing.assert_array_equal(seen["start"][name], kept[name])
    for name in start.keys() - norm:
        np.testing.assert_array_equal(seen["start"][name], task_weights[name])
    sent, _ = uploaded(body)
    assert all(np.array_equal(sent[name], task_weights[name]) for name in sent)


def test_a_kept_norm_that_does_not_fit_is_ignored(
    state: Path, start: Arrays, caplog: pytest.LogCaptureFixture
) -> None:
    names = names_of_norm()
    misfit = {name: np.zeros(3, dtype=np.float32) for name in names}  # another model's layer widths
    LocalNorm(state).save(misfit)
    laid = lay_over(start, LocalNorm(state).load(), names)
    assert laid is start
    assert "do not fit" in caplog.text
    trainer = Trainer("d1", local_norm=LocalNorm(state))
    _, body = trainer.train(make_task({"local_norm": 1.0}), start, TRAIN)
    assert uploaded(body)[0].keys() == start.keys() - names
    kept = LocalNorm(state).load()
    assert kept is not None and all(kept[name].shape == start[name].shape for name in names)


def test_a_corrupt_kept_norm_file_is_ignored(state: Path, caplog: pytest.LogCaptureFixture) -> None:
    state.mkdir(parents=True)
    (state / NORM_FILE).write_bytes(b"not safetensors")
    assert LocalNorm(state).load() is None
    assert "ignoring the kept normalisation layers" in caplog.text


def test_local_norm_needs_somewhere_to_keep_the_layers(start: Arrays) -> None:
    with pytest.raises(UnknownSetting, match="local_norm"):
        Trainer("d1").train(make_task({"local_norm": 1.0}), start, TRAIN)


def test_evaluation_under_local_norm_uses_the_kept_layers(state: Path, start: Arrays) -> None:
    trainer = Trainer("d1", local_norm=LocalNorm(state))
    evaluation = make_task(action="evaluate", upload_path="/api/rounds/1/evaluations")
    plain = report(trainer.evaluate(evaluation, start, TEST))
    nothing_kept = report(trainer.evaluate(replace(evaluation, config={"local_norm": 1.0}), start, TEST))
    assert nothing_kept.loss_sum == pytest.approx(plain.loss_sum)

    LocalNorm(state).save(shifted(start, names_of_norm(), by=3.0))
    personal = report(trainer.evaluate(replace(evaluation, config={"local_norm": 1.0}), start, TEST))
    assert personal.loss_sum != pytest.approx(plain.loss_sum)
    assert report(trainer.evaluate(evaluation, start, TEST)).loss_sum == pytest.approx(plain.loss_sum)
    assert np.sum(personal.confusion) == len(TEST.labels)


# SiloBN


def statistics_of(arrays: Arrays, clips: Split) -> Arrays:
    """The running statistics a model holding arrays takes on the clips."""
    from fedspeech.models import build_model
    from fedspeech.models.norm import refresh_statistics
    from fedspeech.models.train import get_arrays, set_arrays

    model = build_model(SPEC)
    set_arrays(model, arrays)
    refresh_statistics(model, clips.waveforms, 8)
    return {name: get_arrays(model)[name] for name in names_of_statistics()}


def test_under_local_statistics_everything_is_uploaded_and_the_statistics_kept(
    state: Path, start: Arrays
) -> None:
    statistics = names_of_statistics()
    assert statistics and statistics < names_of_norm(), "the scale and shift are not statistics"
    trainer = Trainer("d1", local_norm=LocalNorm(state))
    _, body = trainer.train(make_task({"local_statistics": 1.0}), start, TRAIN)
    sent, _ = uploaded(body)
    assert sent.keys() == start.keys()
    kept = LocalNorm(state).load()
    assert kept is not None and kept.keys() == statistics
    for name in statistics:
        np.testing.assert_array_equal(kept[name], sent[name])
    assert any(not np.array_equal(kept[name], start[name]) for name in statistics)


def test_evaluation_under_local_statistics_takes_and_keeps_those_of_the_devices_clips(
    state: Path, start: Arrays
) -> None:
    trainer = Trainer("d1", local_norm=LocalNorm(state))
    evaluation = make_task(action="evaluate", upload_path="/api/rounds/1/evaluations")
    plain = report(trainer.evaluate(evaluation, start, TEST, TRAIN))
    assert LocalNorm(state).load() is None, "a plain evaluation keeps nothing"

    loud = replace(TRAIN, waveforms=TRAIN.waveforms * 20)  # a louder voice than the global statistics know
    own = report(trainer.evaluate(replace(evaluation, config={"local_statistics": 1.0}), start, TEST, loud))
    assert own.loss_sum != pytest.approx(plain.loss_sum)
    assert np.sum(own.confusion) == len(TEST.labels)
    kept = LocalNorm(state).load()
    assert kept is not None
    expected = statistics_of(start, loud)
    assert kept.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(kept[name], value, rtol=1e-5, atol=1e-6)


def test_local_statistics_and_local_norm_together_are_refused(state: Path, start: Arrays) -> None:
    with pytest.raises(UnknownSetting, match="together"):
        training_settings(make_task({"local_statistics": 1.0, "local_norm": 1.0}))


# FedVMR's class-distribution regulariser


@pytest.mark.parametrize("config", [{"prior_weight": 1.0}, {"prior_weight": 0.5, "class_prior": SKEWED}])
def test_predicted_counts_are_reported_with_prior_weight(start: Arrays, config: dict[str, Any]) -> None:
    _, body = Trainer("d1").train(make_task(config), start, TRAIN)
    counts = json.loads(uploaded(body)[1]["predicted_counts"])
    assert len(counts) == SPEC.num_classes and all(isinstance(c, int) and c >= 0 for c in counts)
    assert sum(counts) == len(TRAIN.labels)


def test_no_predicted_counts_without_prior_weight(start: Arrays) -> None:
    _, body = Trainer("d1").train(make_task(), start, TRAIN)
    assert "predicted_counts" not in uploaded(body)[1]


def test_the_class_prior_changes_training(start: Arrays) -> None:
    trainer = Trainer("d1")
    first_round = uploaded(trainer.train(make_task({"prior_weight": 1.0}), start, TRAIN)[1])[0]
    again = uploaded(trainer.train(make_task({"prior_weight": 1.0}), start, TRAIN)[1])[0]
    regularised = make_task({"prior_weight": 1.0, "class_prior": SKEWED})
    with_prior = uploaded(trainer.train(regularised, start, TRAIN)[1])[0]
    assert all(np.array_equal(first_round[name], again[name]) for name in start)  # same seed, same run
    assert any(not np.array_equal(first_round[name], with_prior[name]) for name in start)


BAD_CONFIGS = {
    "unknown key": {"momentum_boost": 2.0},
    "prior without weight": {"class_prior": [0.1] * 10},
    "prior too short": {"prior_weight": 1.0, "class_prior": [0.2] * 5},
    "prior not summing to 1": {"prior_weight": 1.0, "class_prior": [0.2] * 10},
    "prior with a zero": {"prior_weight": 1.0, "class_prior": [0.0] + [1 / 9] * 9},
    "prior with a negative": {"prior_weight": 1.0, "class_prior": [-0.1, 0.2] + [0.1] * 8},
    "prior not a list": {"prior_weight": 1.0, "class_prior": 0.1},
    "weight a list": {"prior_weight": [1.0]},
    "weight too large": {"prior_weight": 101.0},
    "weight negative": {"prior_weight": -0.5},
    "local_norm above 1": {"local_norm": 2.0},
    "local_statistics negative": {"local_statistics": -1.0},
    "distillation weight out of range": {"distill_weight": -1.0},
    "no time to train": {"time_budget_s": 0.0},
    "longer than any task": {"time_budget_s": 1e9},
}


@pytest.mark.parametrize("config", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_bad_settings_are_refused(config: dict[str, Any]) -> None:
    with pytest.raises(UnknownSetting):
        training_settings(make_task(config))


@pytest.mark.parametrize(
    "config",
    [
        {"distill_weight": 1.0, "distill_temperature": 0.01},
        {"distill_weight": 101.0},
        {"distill_temperature": 2.0},  # a teacher without distill_weight
        {},
    ],
)
def test_bad_distillation_settings_are_refused(config: dict[str, Any]) -> None:
    with pytest.raises(UnknownSetting):
        training_settings(make_task(config, teacher=TEACHER))


def test_good_settings_become_terms_and_flags() -> None:
    near_one = list(np.full(10, 0.1) + 1e-8)
    config: dict[str, Any] = {"prior_weight": 2.0, "class_prior": near_one, "local_norm": 1.0}
    settings = training_settings(make_task(config))
    assert settings.local_norm and settings.report_counts and not settings.distill
    terms = terms_from_settings(config, SPEC.num_classes, None, DEVICE_SETTINGS)
    assert terms == [ClassPrior(2.0, tuple(near_one))]
    distilling = make_task({"distill_weight": 0.5, "distill_temperature": 3.0}, teacher=TEACHER)
    settings = training_settings(distilling)
    assert settings.distill and not settings.local_norm and not settings.report_counts
    first_round = make_task({"distill_weight": 1.0, "distill_temperature": 2.0})
    assert not training_settings(first_round).distill, "no server model yet: no distillation"


def test_the_trainer_trains_with_the_terms_of_its_task(
    start: Arrays, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedspeech.models import train as train_module
    from fedspeech.models.train import TrainResult, get_arrays

    seen: list[Any] = []

    def no_training(model: Any, *args: Any, terms: Any = (), **kwargs: Any) -> TrainResult:
        seen.append(terms)
        return TrainResult(len(TRAIN.labels), 1.0, 0.1, 0.01)

    monkeypatch.setattr(train_module, "train_local", no_training)
    config = {"proximal_mu": 0.5, "prior_weight": 1.0, "class_prior": SKEWED, "distill_weight": 0.25}
    teacher = fresh(seed=5)
    trainer = Trainer("d1")
    trainer.train(make_task(config | {"time_budget_s": 30.0}, teacher=TEACHER), start, TRAIN, teacher)
    distillation, prior, proximal, budget = seen[0]
    assert distillation.weight == 0.25 and distillation.temperature == 1.0
    assert distillation.teacher is trainer.teacher(SPEC, teacher)
    assert all(np.array_equal(get_arrays(distillation.teacher)[k], v) for k, v in teacher.items())
    assert (prior, proximal, budget) == (ClassPrior(1.0, tuple(SKEWED)), Proximal(0.5), TimeBudget(30.0))
    trainer.train(make_task({"prior_weight": 1.0}), start, TRAIN)  # the first round: no prior yet
    assert seen[1] == []


def test_a_new_term_is_one_class_in_the_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedspeech.models import objectives

    @dataclass(frozen=True)
    class Small(objectives.LossTerm):  # keeps the logits near zero
        weight: float
        SETTINGS = (objectives.Number("small_logits", 0.5, 2.0),)

        @classmethod
        def from_settings(cls, config: Any, teacher: Any) -> "Small | None":
            return cls(config["small_logits"]) if "small_logits" in config else None

        def start(self, model: Any) -> objectives.BatchValue:
            return lambda inputs, logits: logits.square().mean()

    with pytest.raises(UnknownSetting, match="unknown training setting 'small_logits'"):
        training_settings(make_task({"small_logits": 1.5}))
    monkeypatch.setattr(objectives, "TERMS", (*objectives.TERMS, Small))
    training_settings(make_task({"small_logits": 1.5}))
    with pytest.raises(UnknownSetting, match="outside"):
        training_settings(make_task({"small_logits": 3.0}))
    assert terms_from_settings({"small_logits": 1.5}, SPEC.num_classes) == [Small(1.5)]


def test_the_trainer_refuses_bad_settings_before_training(start: Arrays) -> None:
    with pytest.raises(UnknownSetting, match="sums to"):
        Trainer("d1").train(make_task({"prior_weight": 1.0, "class_prior": [0.2] * 10}), start, TRAIN)


# mutual knowledge distillation


def test_the_teacher_is_used(start: Arrays) -> None:
    trainer = Trainer("d1")
    plain = uploaded(trainer.train(make_task(), start, TRAIN)[1])[0]
    task = make_task({"distill_weight": 1.0, "distill_temperature": 2.0}, teacher=TEACHER)
    distilled = uploaded(trainer.train(task, start, TRAIN, fresh(seed=5))[1])[0]
    assert any(not np.array_equal(plain[name], distilled[name]) for name in start)
    idle = make_task({"distill_weight": 0.0}, teacher=TEACHER)
    not_distilled = uploaded(trainer.train(idle, start, TRAIN, fresh(seed=5))[1])[0]
    assert all(np.array_equal(plain[name], not_distilled[name]) for name in start)


def test_the_teacher_model_is_built_once_per_spec_and_checked(start: Arrays) -> None:
    trainer = Trainer("d1")
    teacher = trainer.teacher(SPEC, start)
    assert trainer.teacher(SPEC, fresh(seed=5)) is teacher
    assert teacher is not trainer.model(SPEC)
    with pytest.raises(weights.WeightsError):
        trainer.teacher(SPEC, fresh(replace(SPEC, name="cnn")))
    with pytest.raises(ValueError, match="teacher"):  # the task names one and none was fetched
        trainer.train(make_task({"distill_weight": 1.0}, teacher=TEACHER), start, TRAIN)


# the personalised model for the listener


class Blobs:
    """Serves one ONNX file as the coordinator would."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def fetch(self, ref: BlobRef) -> bytes:
        return self.data

    def latest_announcement(self, topic: str) -> None:
        return None  # nothing announced over HTTP: the announcements offered count


def announce(onnx_file: bytes, round: int = 1) -> ModelAnnouncement:
    return ModelAnnouncement(
        round=round,
        spec=SPEC,
        labels=LABELS,
        weights=BlobRef(f"/api/models/{round}/weights", "0" * 64, 1),
        onnx=BlobRef(f"/api/models/{round}/onnx", weights.sha256(onnx_file), len(onnx_file)),
    )


GLOBAL_SEED = 11


@pytest.fixture(scope="module")
def global_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fedspeech.export.onnx_export import export_onnx
    from fedspeech.models import build_model
    from fedspeech.models.train import set_arrays

    model = build_model(SPEC)
    set_arrays(model, fresh(seed=GLOBAL_SEED))
    return export_onnx(model, SPEC, LABELS, tmp_path_factory.mktemp("export") / "global.onnx")


@pytest.mark.parametrize("kept_names", [names_of_norm, names_of_statistics], ids=["fedbn", "silobn"])
def test_the_keeper_writes_a_personalised_model(
    state: Path,
    tmp_path: Path,
    global_onnx: Path,
    caplog: pytest.LogCaptureFixture,
    kept_names: Callable[[], set[str]],
) -> None:
    from fedspeech.export.onnx_export import PREFIX, parity
    from fedspeech.models import build_model
    from fedspeech.models.train import set_arrays

    caplog.set_level(logging.INFO, logger="fedspeech.edge_client")
    original, arrays, names = initializers(global_onnx), fresh(seed=GLOBAL_SEED), kept_names()
    kept = shifted(arrays, names)
    LocalNorm(state).save(kept)
    keeper = ModelKeeper(tmp_path / "models", LocalNorm(state))
    keeper.offer(announce(global_onnx.read_bytes()))
    keeper.keep(Blobs(global_onnx.read_bytes()))  # type: ignore[arg-type]
    path = tmp_path / "models" / KEPT_MODEL
    personal = initializers(path)
    for name in names:
        np.testing.assert_array_equal(personal[PREFIX + name], kept[name])
    for name in original.keys() - {PREFIX + n for n in names}:
        np.testing.assert_array_equal(personal[name], original[name])
    assert "kept the personalised model of round 1" in caplog.text
    # the file computes what the model with the kept layers computes
    model = build_model(SPEC)
    set_arrays(model, {**arrays, **kept})
    assert parity(model, path, TEST.waveforms[:4]).max_abs_diff < 1e-4


def test_the_keeper_keeps_the_global_model_when_the_layers_do_not_fit(
    state: Path, tmp_path: Path, global_onnx: Path, caplog: pytest.LogCaptureFixture
) -> None:
    LocalNorm(state).save({"features.1.1.weight": np.ones(3, dtype=np.float32)})
    keeper = ModelKeeper(tmp_path / "models", LocalNorm(state))
    keeper.offer(announce(global_onnx.read_bytes()))
    keeper.keep(Blobs(global_onnx.read_bytes()))  # type: ignore[arg-type]
    assert (tmp_path / "models" / KEPT_MODEL).read_bytes() == global_onnx.read_bytes()
    assert "keeping the global model of round 1, not a personalised one" in caplog.text
    assert keeper.kept_round == 1


def test_the_keeper_without_kept_layers_writes_the_global_model(state: Path, tmp_path: Path) -> None:
    keeper = ModelKeeper(tmp_path / "models", LocalNorm(state))
    keeper.offer(announce(b"onnx of round 2", round=2))
    keeper.keep(Blobs(b"onnx of round 2"))  # type: ignore[arg-type]
    assert (tmp_path / "models" / KEPT_MODEL).read_bytes() == b"onnx of round 2"
