"""Federated evaluation: the maths of pooling device counts, and the coordinator's intake of reports."""

import logging

import numpy as np
import pytest

from fedspeech.coordinator.config import RoundConfig
from fedspeech.coordinator.round.evaluation import Counts, combine
from fedspeech.coordinator.round.evaluation_phase import evaluates, evaluation_plan, evaluators
from fedspeech.models import scores
from fedspeech.models.calibration import BINS
from fedspeech.protocol import bounds, messages, weights
from fedspeech.protocol.messages import Credentials, EvaluationReport, Profile, Registration, TaskFailure
from tests.helpers.devices import one_round_coordinator
from tests.helpers.waiting import wait_for


def _counts(confusion: np.ndarray, loss_sum: float, decisions: int = 0) -> Counts:
    """A report's counts, with a number of word decisions (all right, at 0.5)."""
    counted = np.zeros((2, BINS), dtype=np.int64)
    counted[0, BINS // 2] = decisions
    return Counts(confusion, loss_sum, counted)


def test_pooled_counts_score_like_the_union_of_the_test_sets():
    rng = np.random.default_rng(0)
    labels = [rng.integers(0, 4, size=n) for n in (12, 5, 12)]  # none over the median: each counts whole
    predictions = [np.where(rng.random(len(y)) < 0.7, y, rng.integers(0, 4, size=len(y))) for y in labels]
    losses = [rng.random(len(y)) for y in labels]
    reports = {
        f"d{i}": _counts(scores.confusion_matrix(y, p, 4), float(loss.sum()))
        for i, (y, p, loss) in enumerate(zip(labels, predictions, losses, strict=True))
    }
    pooled = combine(reports, min_reports=1)
    union_y, union_p = np.concatenate(labels), np.concatenate(predictions)
    assert pooled.accuracy == pytest.approx(np.mean(union_y == union_p))
    assert pooled.loss == pytest.approx(np.concatenate(losses).mean())
    f1 = [
        2 * np.sum((union_p == c) & (union_y == c)) / (np.sum(union_p == c) + np.sum(union_y == c))
        for c in np.union1d(union_y, union_p)
    ]
    assert pooled.macro_f1 == pytest.approx(np.mean(f1))
    assert pooled.clips == 29 and [d.clips for d in pooled.devices] == [12, 5, 12]
    assert pooled.devices[1].accuracy == pytest.approx(np.mean(labels[1] == predictions[1]))


def test_too_few_reports_give_no_scores_and_empty_reports_do_not_count():
    one = np.array([[3, 1], [0, 2]])
    empty = np.zeros((2, 2), dtype=np.int64)
    assert combine({}, min_reports=1) is None
    assert combine({"a": _counts(empty, 0.0)}, min_reports=1) is None  # a device without test clips
    assert combine({"a": _counts(one, 1.0), "b": _counts(empty, 0.0)}, min_reports=2) is None
    both = combine({"a": _counts(one, 1.0, 2), "b": _counts(one, 3.0, 3)}, min_reports=2)
    assert both.accuracy == pytest.approx(5 / 6)
    assert both.decisions.sum() == 2 + 3, "the word decisions summed"


def test_a_device_reporting_many_clips_all_right_moves_the_figure_and_threshold_by_its_share_at_most():
    honest = np.array([[40, 10], [10, 40]])  # 100 clips, 80 % right
    liar = np.array([[10**6, 0], [0, 10**6]])  # as many as it registered, every one right
    reports = {f"h{i}": _counts(honest, 50.0, 40) for i in range(4)}
    clean = combine(reports, min_reports=1)
    lied = combine({**reports, "liar": _counts(liar, 0.0, 2 * 10**6)}, min_reports=1)
    # weighed as the median device: 100 clips, all right, of 500
    assert lied.accuracy == pytest.approx((4 * 80 + 100) / 500) and clean.accuracy == pytest.approx(0.8)
    assert lied.accuracy - clean.accuracy <= (1 - clean.accuracy) / 5
    assert lied.decisions.sum() == pytest.approx(4 * 40 + 100), "its word decisions weighed as its clips"
    assert lied.clips == 4 * 100 + 2 * 10**6, "the clips the figure rests on, as reported"


DEVICE = "kitchen"


@pytest.fixture
def coordinator(tmp_path, mosquitto_url, topic_root):
    with one_round_coordinator(tmp_path, mosquitto_url, topic_root, DEVICE, eval_timeout=120.0) as running:
        yield running


def test_which_rounds_are_evaluated_and_by_whom():
    assert [r for r in range(1, 11) if evaluates(r, 3, 10)] == [3, 6, 9, 10]
    assert not any(evaluates(r, 0, 10) for r in range(1, 11))
    online = ["d3", "d1", "d2", "d0"]
    assert evaluators(online, 0, seed=0, round=1) == online and evaluators(online, 4, 0, 1) == online
    two = evaluators(online, 2, seed=0, round=1)
    assert len(two) == 2 and set(two) <= set(online) and two == sorted(two)
    assert two == evaluators(online, 2, seed=0, round=1), "the same draw for the same seed and round"
    assert len({tuple(evaluators(online, 2, 0, r)) for r in range(1, 20)}) > 1, "a new draw each round"


def test_a_device_still_training_evaluates_only_the_last_round_after_its_training():
    config = RoundConfig(rounds=5, eval_timeout=60.0)
    training = {"slow": 1000.0}  # its task's deadline
    assert evaluation_plan(config, 4, ["fast", "slow"], training, now=900.0) == (["fast"], 960.0)
    assert evaluation_plan(config, 5, ["fast", "slow"], training, now=900.0) == (["fast", "slow"], 1060.0)
    far = {"slow": 900.0 + bounds.MAX_TASK_SECONDS}
    assert evaluation_plan(config, 5, ["slow"], far, now=900.0)[1] == 900.0 + bounds.MAX_TASK_SECONDS


def test_bad_reports_are_rejected_and_a_good_one_is_pooled(coordinator, caplog):
    app, service, device = coordinator
    caplog.set_level(logging.INFO)
    http = app.test_client()
    wait_for(lambda: service.store.latest_round(), 60, "round 0")
    test_counts = dict.fromkeys("0123456789", 6)  # the device's test clips, which bound its reports
    registration = Registration(DEVICE, 100, Profile(2, 0.0, 512.0), test_counts)
    reply = http.post("/api/devices", data=messages.encode(registration))
    token = messages.decode(reply.data, Credentials).token
    device.go_online(100)
    train = device.next_task(30)
    assert train.action == "train" and train.definition.labels == [*(str(d) for d in range(10)), "_none_"]
    arrays, _ = weights.decode(http.get(train.weights.path).data)
    update = weights.encode(arrays, {"task_id": train.task_id, "num_samples": "100"})
    headers = {"Authorization": f"Bearer {token}", "X-Content-SHA256": weights.sha256(update)}
    assert http.post(train.upload_path, data=update, headers=headers).status_code == 200

    evaluate = device.next_task(60)
    assert evaluate.action == "evaluate" and evaluate.round == 1
    assert (
        evaluate.upload_path == "/api/rounds/1/evaluations"
        and evaluate.weights.path == "/api/models/1/weights"
    )
    confusion = np.eye(11, dtype=int) * 4  # the digits and _none_
    confusion[10, 10] = 0  # no clip of the none class
    confusion[3, 5] = 2  # 40 of 42 right
    good = messages.encode(EvaluationReport(evaluate.task_id, 1, confusion.tolist(), 8.4))
    auth = {"Authorization": f"Bearer {token}"}

    def post(data: bytes, headers: dict | None = None, round: int = 1):
        return http.post(
            f"/api/rounds/{round}/evaluations", data=data, headers=auth if headers is None else headers
        )

    assert post(good, headers={}).status_code == 401
    assert post(good, headers={"Authorization": "Bearer forged"}).status_code == 401
    assert post(b"{not json").status_code == 400
    assert post(b"{" + b" " * 200_000 + b"}").status_code == 413
    small = messages.encode(EvaluationReport(evaluate.task_id, 1, [[1, 0], [0, 1]], 0.1))
    assert post(small).status_code == 400  # two classes: the task has eleven
    beyond = confusion.copy()
    beyond[3, 3] = 5  # 7 clips of class 3: it registered 6
    assert (
        post(messages.encode(EvaluationReport(evaluate.task_id, 1, beyond.tolist(), 8.4))).status_code == 400
    )
    other = messages.encode(EvaluationReport("not-the-task", 1, confusion.tolist(), 8.4))
    assert post(other).status_code == 409
    assert post(good, round=2).status_code == 409
    assert service.store.latest_round().evaluation_asked is None, "nothing counted yet"

    assert post(good).status_code == 200
    assert post(good).status_code == 409  # once per device
    wait_for(lambda: service.orchestrator.finished.is_set(), 30, "the evaluation to close")
    record = service.store.latest_round()
    assert (record.evaluation_asked, record.evaluation_reports) == (1, 1)
    assert record.federated_accuracy == pytest.approx(40 / 42)
    assert record.federated_loss == pytest.approx(8.4 / 42)
    detail = http.get("/api/rounds/1").get_json()
    assert detail["evaluations"] == [
        {"device_id": DEVICE, "clips": 42, "correct": 40, "loss_sum": 8.4, "accuracy": pytest.approx(40 / 42)}
    ]
    assert record.accuracy is None, "no central held-out set was given"


def test_an_evaluation_that_fails_on_its_device_is_not_waited_for(coordinator):
    app, service, device = coordinator
    http = app.test_client()
    wait_for(lambda: service.store.latest_round(), 60, "round 0")
    registration = Registration(DEVICE, 50, Profile(2, 0.0, 512.0), dict.fromkeys("0123456789", 6))
    token = messages.decode(
        http.post("/api/devices", data=messages.encode(registration)).data, Credentials
    ).token
    device.go_online(50)
    auth = {"Authorization": f"Bearer {token}"}
    train = device.next_task(30)
    arrays, _ = weights.decode(http.get(train.weights.path).data)
    update = weights.encode(arrays, {"task_id": train.task_id, "num_samples": "50"})
    headers = {**auth, "X-Content-SHA256": weights.sha256(update)}
    assert http.post(train.upload_path, data=update, headers=headers).status_code == 200

    evaluate = device.next_task(60)
    assert evaluate.action == "evaluate"
    failure = messages.encode(TaskFailure("no test clips: /srv/clips cannot be listed"))
    assert http.post(f"/api/tasks/{evaluate.task_id}/failure", data=failure, headers=auth).status_code == 200
    wait_for(service.orchestrator.finished.is_set, 10, "the evaluation to end, not its 120 s deadline")
    record = service.store.latest_round()
    assert (record.evaluation_asked, record.evaluation_reports, record.federated_accuracy) == (1, 0, None)
    error = service.uploads.last_errors()[DEVICE]
    assert (error.round, error.reason) == (1, "no test clips: /srv/clips cannot be listed")
