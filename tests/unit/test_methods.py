"""The methods of FedBN, FedVMR and FedCSR on the coordinator: their maths alone, then their rounds with
the fake devices and fake model of test_orchestrator (no broker, no HTTP, no torch)."""

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest

from fedspeech.coordinator.refusals import BadUpload, NotWanted
from fedspeech.coordinator.round.modes.chained import Chain
from fedspeech.coordinator.strategies import Result, strategy_params
from fedspeech.coordinator.strategies.aggregate import population_distribution, quality_weights
from fedspeech.coordinator.strategies.grouped import deal_groups
from fedspeech.protocol import routes, weights
from fedspeech.protocol.messages import BlobRef, Task
from fedspeech.protocol.weights import Arrays
from tests.helpers.fake_fleet import FakeModel, Fleet

pytestmark = pytest.mark.timeout(30)


# -- the maths ---------------------------------------------------------------------------------------


def test_quality_weights_are_the_softmax_of_scores_over_the_temperature():
    e9, e5 = math.exp(0.9 / 0.1), math.exp(0.5 / 0.1)
    assert quality_weights([0.9, 0.5], 0.1) == pytest.approx([e9 / (e9 + e5), e5 / (e9 + e5)])
    with_samples = [e9 * 10 / (e9 * 10 + e5 * 30), e5 * 30 / (e9 * 10 + e5 * 30)]
    assert quality_weights([0.9, 0.5], 0.1, [10, 30]) == pytest.approx(with_samples)
    assert quality_weights([0.9, 0.5], 100.0) == pytest.approx([0.5, 0.5], abs=0.002), "hot: nearly equal"
    assert quality_weights([1000.0, 0.0], 0.01) == pytest.approx([1.0, 0.0]), "no overflow"
    with pytest.raises(ValueError):
        quality_weights([0.5, math.nan], 0.1)


def test_population_distribution_pools_smoothed_predicted_counts_by_samples():
    # device 1 predicts [3, 0, 1] of its 4 clips, device 2 [0, 0, 2] of its 2: +1 smoothing first
    p = population_distribution([[3, 0, 1], [0, 0, 2]], [4, 2])
    q1, q2 = np.array([4, 1, 2]) / 7, np.array([1, 1, 3]) / 5
    assert p == pytest.approx(4 / 6 * q1 + 2 / 6 * q2)
    assert p.sum() == pytest.approx(1.0) and (p > 0).all(), "every class stays possible"
    with pytest.raises(ValueError):
        population_distribution([[1, 2], [1]], [1, 1])


def test_groups_are_dealt_from_one_to_one_per_device():
    devices = [f"d{i}" for i in range(5)]
    rng = np.random.default_rng(0)
    assert [sorted(g) for g in deal_groups(devices, 1, rng)] == [devices], "G = 1: fully sequential"
    assert sorted(len(g) for g in deal_groups(devices, 0, rng)) == [1] * 5, "G = 0: one each, FedAvg"
    two = deal_groups(devices, 2, rng)
    assert sorted(len(g) for g in two) == [2, 3] and sorted(sum(two, [])) == devices
    assert len(deal_groups(devices, 9, rng)) == 5, "never an empty group"
    again = [deal_groups(devices, 2, np.random.default_rng(7)) for _ in range(2)]
    assert again[0] == again[1], "the same deal for the same seed"


def _result(device: str, value: float, samples: int) -> Result:
    return Result(device, {"w": np.full(2, value, np.float32)}, samples)


def test_a_chain_passes_the_last_good_model_on_and_skips_a_dropped_device():
    chain = Chain(["a", "b", "c"])
    ref_a = BlobRef(routes.relay(1, 1), "0" * 64, 10)
    assert chain.current == "a" and chain.last_ref is None, "the first device starts from the global model"
    chain.advance(_result("a", 1.0, 10), ref_a)
    assert chain.current == "b" and chain.last_ref == ref_a
    chain.advance(None)  # b dropped out at its deadline
    assert chain.current == "c" and chain.last_ref == ref_a, "c starts from a's model, the last good one"
    assert chain.result() is None, "not through yet"
    with pytest.raises(ValueError, match="while c trains"):
        chain.advance(_result("b", 2.0, 10))
    chain.advance(_result("c", 3.0, 30))
    result = chain.result()
    assert result is not None and result.device_id == "c"
    assert result.num_samples == 40, "b's samples are not counted"
    assert chain.skipped == ["b"]
    assert Chain(["x"], position=1).result() is None, "a group where nobody answered has no model"


# -- the rounds, with fakes ----------------------------------------------------------------------------


@dataclass
class MethodsModel(FakeModel):
    """The fake model with a validation score, a server model and, with norm, a normalisation array 'bn'."""

    can_score: bool = True
    can_distil: bool = True
    norm: bool = False
    distilled: list[tuple[Arrays, Arrays]] = field(default_factory=list)

    def initial(self, seed: int, depth: int | None = None) -> Arrays:
        bn = {"bn": np.full(2, 5.0, np.float32)} if self.norm else {}
        return {"w": np.zeros(2, np.float32), **bn}

    def norm_names(self) -> set[str]:
        return {"bn"} if self.norm else set()

    def score(self, arrays: Arrays) -> float:
        return float(arrays["w"][0]) / 10  # a higher weight validates better

    def distil(self, student: Arrays, teacher: Arrays, **settings: float) -> Arrays:
        self.distilled.append((student, teacher))
        return {name: a + 100 for name, a in teacher.items()}


def _start_value(fleet: Fleet, device: str, task: Task) -> float:
    """The first weight of the model a task trains from, as the device downloads it."""
    if task.weights.path.startswith(routes.PREFIX + "/rounds/"):
        step = int(task.weights.path.rsplit("/", 1)[1])
        path = fleet.uploads.relay_file(task.round, step, device)
    else:
        path = fleet.store.model_path(routes.model_round(task.weights.path, "weights"), "weights")
    return float(weights.decode(path.read_bytes())[0]["w"][0])


def _chain_fleet(tmp_path, groups: int, silent: str | None = None) -> Fleet:
    """Three devices that each upload the model they start from plus one (silent: never answers)."""
    fleet = Fleet(
        tmp_path, rounds=1, strategy="grouped", strategy_settings={"groups": groups}, round_timeout=0.5
    )
    for device in ("a", "b", "c"):
        fleet.device(device, value=None, samples=10)
        if device != silent:
            fleet.link.responders[device] = lambda task, d=device: fleet.upload(
                d, task, _start_value(fleet, d, task) + 1.0
            )
    return fleet


@pytest.mark.parametrize(("groups", "final"), [(1, 3.0), (0, 1.0)])
def test_one_group_chains_all_devices_and_one_per_device_is_fedavg(tmp_path, groups, final):
    fleet = _chain_fleet(tmp_path, groups)
    fleet.finish()
    record = fleet.store.rounds()[1]
    assert record.accuracy == pytest.approx(final), "G = 1: 0 + 1 + 1 + 1; G = N: each 0 + 1, averaged"
    assert record.results == 3
    order = [d for d, t in fleet.link.published if t.action == "train"]
    assert sorted(order) == ["a", "b", "c"]
    if groups == 1:
        later = [t for _, t in fleet.link.published[1:]]
        assert all(t.weights.path.startswith(routes.PREFIX + "/rounds/1/relays/") for t in later)
    assert not (fleet.store.dir / "relays" / "round-00001").exists(), "relayed updates are not kept"


def test_a_device_that_drops_out_mid_chain_is_skipped_at_its_deadline(tmp_path, caplog):
    fleet = _chain_fleet(tmp_path, 1)
    fleet.link.responders.clear()
    order: list[str] = []

    def answer(device: str, task: Task) -> None:
        order.append(device)
        if len(order) != 2:  # the second device in the chain never answers
            fleet.upload(device, task, _start_value(fleet, device, task) + 1.0)

    for device in ("a", "b", "c"):
        fleet.link.responders[device] = lambda task, d=device: answer(d, task)
    fleet.finish()
    record = fleet.store.rounds()[1]
    assert record.accuracy == pytest.approx(2.0), "the third started from the first's model"
    assert (record.results, record.devices) == (2, 3)
    assert f"{order[1]} did not answer in time" in caplog.text


def test_an_update_out_of_turn_in_a_group_is_not_wanted(tmp_path):
    fleet = _chain_fleet(tmp_path, 1, silent="a")
    fleet.link.responders.clear()
    first: list[tuple[str, Task]] = []
    for device in ("a", "b", "c"):
        fleet.link.responders[device] = lambda task, d=device: first.append((d, task))
    with fleet.running():
        while not first:
            time.sleep(0.01)
        device, task = first[0]
        other = next(d for d in ("a", "b", "c") if d != device)
        with pytest.raises(NotWanted, match=f"no open task .* for {other}"):
            fleet.upload(other, task, 9.0)  # its turn has not come: it has no task yet


def test_quality_weighting_favours_the_update_that_validates_better(tmp_path):
    fleet = Fleet(
        tmp_path, model=MethodsModel(), rounds=1, strategy="quality", strategy_settings={"temperature": 0.1}
    )
    fleet.device("good", value=2.0, samples=10)
    fleet.device("poor", value=1.0, samples=10)
    fleet.finish()
    w_good = quality_weights([0.2, 0.1], 0.1)[0]
    assert fleet.store.rounds()[1].accuracy == pytest.approx(w_good * 2.0 + (1 - w_good) * 1.0)


def test_quality_weighting_without_a_validation_set_refuses_to_start(tmp_path):
    with pytest.raises(ValueError, match="--validation-data"):
        Fleet(tmp_path, model=MethodsModel(can_score=False), strategy="quality")


def test_fedbn_takes_uploads_without_normalisation_and_keeps_the_global_ones(tmp_path):
    fleet = Fleet(tmp_path, model=MethodsModel(norm=True), rounds=1, strategy="fedbn")
    for device, value in (("a", 1.0), ("b", 3.0)):
        fleet.device(device, value=None, samples=10)
        fleet.link.responders[device] = lambda task, d=device, v=value: fleet.upload(d, task, v)
    fleet.finish()
    stored = weights.decode(fleet.store.model_path(1, "weights").read_bytes())[0]
    assert stored["w"] == pytest.approx([2.0, 2.0]) and stored["bn"] == pytest.approx([5.0, 5.0])
    assert all(t.config == {"local_norm": 1.0} for _, t in fleet.link.published)


@contextmanager
def _first_task(fleet: Fleet) -> Iterator[Task]:
    """Two silent devices a and b; yields a's first task while its round is open."""
    fleet.device("a", value=None)
    fleet.device("b", value=None)
    got: list[Task] = []
    fleet.link.responders["a"] = got.append
    with fleet.running():
        while not got:
            time.sleep(0.01)
        yield got[0]


def test_fedbn_refuses_an_update_that_carries_normalisation_layers(tmp_path):
    fleet = Fleet(tmp_path, model=MethodsModel(norm=True), rounds=1, strategy="fedbn")
    with _first_task(fleet) as task:
        body = weights.encode(
            {"w": np.ones(2, np.float32), "bn": np.ones(2, np.float32)},
            {"task_id": task.task_id, "num_samples": "10"},
        )
        with pytest.raises(BadUpload, match="bn"):
            fleet.uploads.receive_update(1, "a", body, weights.sha256(body))


@pytest.mark.parametrize("strategy", ["fedbn", "silobn"])
def test_methods_with_normalisation_of_each_device_need_a_model_with_batch_normalisation(tmp_path, strategy):
    with pytest.raises(ValueError, match="cnn_bn"):
        Fleet(tmp_path, model=MethodsModel(norm=False), strategy=strategy)


def test_silobn_averages_everything_and_has_devices_train_and_evaluate_with_their_own_statistics(tmp_path):
    model = MethodsModel(norm=True)
    fleet = Fleet(tmp_path, model=model, rounds=1, strategy="silobn", eval_every=1, eval_timeout=0.3)

    def upload(device: str, task: Task, value: float) -> None:  # statistics included
        if task.action == "train":
            arrays = {name: np.full(2, value, np.float32) for name in ("w", "bn")}
            body = weights.encode(arrays, {"task_id": task.task_id, "num_samples": "10"})
            fleet.uploads.receive_update(task.round, device, body, weights.sha256(body))

    for device, value in (("a", 1.0), ("b", 3.0)):
        fleet.device(device, value=None, samples=10)
        fleet.link.responders[device] = lambda task, d=device, v=value: upload(d, task, v)
    fleet.finish()
    stored = weights.decode(fleet.store.model_path(1, "weights").read_bytes())[0]
    assert stored["w"] == pytest.approx([2.0, 2.0]) and stored["bn"] == pytest.approx([2.0, 2.0])
    actions = {t.action for _, t in fleet.link.published}
    assert actions == {"train", "evaluate"}, "the devices were asked to evaluate their own models"
    assert all(t.config == {"local_statistics": 1.0} for _, t in fleet.link.published)


def test_class_prior_sends_the_population_distribution_of_reported_counts(tmp_path):
    fleet = Fleet(tmp_path, rounds=2, strategy="class_prior", strategy_settings={"weight": 0.5})
    counts = {"a": "[3, 1]", "b": "[0, 2]"}
    for device in ("a", "b"):
        fleet.device(device, value=None, samples=10)
        fleet.link.responders[device] = lambda task, d=device: _upload_counts(fleet, d, task, counts[d])
    fleet.finish()
    first, second = fleet.link.tasks_of(1)["a"].config, fleet.link.tasks_of(2)["a"].config
    assert first == {"prior_weight": 0.5}, "no distribution before any report"
    expected = population_distribution([[3, 1], [0, 2]], [10, 10]).tolist()
    assert second["class_prior"] == pytest.approx(expected)


def _upload_counts(fleet: Fleet, device: str, task: Task, counts: str) -> None:
    body = weights.encode(
        {"w": np.ones(2, np.float32)},
        {"task_id": task.task_id, "num_samples": "10", "predicted_counts": counts},
    )
    fleet.uploads.receive_update(task.round, device, body, weights.sha256(body))


BAD_COUNTS = [
    "[1]",
    "[1, -1]",
    "[1.5, 2]",
    "[1, true]",
    "{}",
    "[1,",
    "[" + "1, " * 2000 + "1]",
    "[1" + "0" * 5000 + "]",
]


@pytest.mark.parametrize("counts", BAD_COUNTS)
def test_malformed_predicted_counts_are_a_bad_upload(tmp_path, counts):
    fleet = Fleet(tmp_path, rounds=1, strategy="class_prior")
    with _first_task(fleet) as task, pytest.raises(BadUpload, match="predicted_counts"):
        _upload_counts(fleet, "a", task, counts)


def test_mkd_trains_the_server_model_after_each_round_and_sends_it_as_teacher(tmp_path):
    model = MethodsModel()
    fleet = Fleet(tmp_path, model=model, rounds=2, strategy="mkd", strategy_settings={"weight": 0.3})
    fleet.device("a", value=1.0)
    fleet.device("b", value=3.0)
    fleet.finish()
    assert len(model.distilled) == 2, "one server training per round"
    assert model.distilled[0][1]["w"] == pytest.approx([2.0, 2.0]), "taught by the new global model"
    assert fleet.link.tasks_of(1)["a"].teacher is None, "no server model before the first round"
    teacher = fleet.link.tasks_of(2)["a"].teacher
    assert teacher is not None and teacher.path == routes.model(1, "teacher")
    served = weights.decode(fleet.store.model_path(1, "teacher").read_bytes())[0]
    assert (
        served["w"] == pytest.approx([102.0, 102.0])
        and weights.sha256(fleet.store.model_path(1, "teacher").read_bytes()) == teacher.sha256
    )
    assert fleet.link.tasks_of(2)["a"].config == {"distill_weight": 0.3, "distill_temperature": 2.0}
    global_ = weights.decode(fleet.store.model_path(2, "weights").read_bytes())[0]
    assert global_["w"] == pytest.approx([2.0, 2.0]), "the exported model is the global one"


@pytest.mark.parametrize("strategy", ["mkd", "fedavg"])
def test_a_restart_takes_back_the_server_model_only_under_a_strategy_that_trains_one(tmp_path, strategy):
    first = Fleet(tmp_path, model=MethodsModel(), rounds=1, strategy="mkd")
    first.device("a", value=1.0)
    first.device("b", value=3.0)
    first.finish()
    stored = weights.decode(first.store.model_path(1, "teacher").read_bytes())[0]
    model = MethodsModel()
    again = Fleet(tmp_path, model=model, rounds=2, strategy=strategy)
    again.device("a", value=1.0)
    again.device("b", value=3.0)
    again.finish()
    teacher = again.link.tasks_of(2)["a"].teacher
    if strategy == "mkd":
        assert teacher is not None and teacher.path == routes.model(1, "teacher")
        assert model.distilled[0][0]["w"] == pytest.approx(stored["w"]), "the stored model trains on"
    else:
        assert teacher is None, "a strategy without a server model sends no teacher"


def test_mkd_without_server_data_refuses_to_start(tmp_path):
    with pytest.raises(ValueError, match="--server-data"):
        Fleet(tmp_path, model=MethodsModel(can_distil=False), strategy="mkd")


def test_method_settings_are_bounded():
    with pytest.raises(ValueError, match="quality: temperature must be between 0.01 and 100"):
        strategy_params("quality", {"temperature": 0.0})
    with pytest.raises(ValueError, match="groups must be between 0"):
        strategy_params("grouped", {"groups": -1})
    with pytest.raises(ValueError, match="strategy grouped: groups takes a whole number"):
        strategy_params("grouped", {"groups": "1.5"})
