"""The uploads alone: uploads checked against the task they answer, kept for the round they count in; late
updates carried over; the checks themselves. Fake devices, a real store, no round loop."""

import threading
from dataclasses import replace

import numpy as np
import pytest

from fedspeech.coordinator.refusals import BadUpload, NotWanted
from fedspeech.coordinator.round.late_updates import LateUpdates
from fedspeech.coordinator.round.open_round import OpenRound
from fedspeech.coordinator.round.update_check import Upload, answered_task, check_update
from fedspeech.coordinator.round.uploads import Uploads
from fedspeech.protocol import bounds, routes, weights
from fedspeech.protocol.messages import BlobRef, ModelSpec, Task
from tests.helpers.fake_fleet import DEFINITION, SPEC, uploads_of

pytestmark = pytest.mark.timeout(30)


def toy_task(precision: weights.Precision = "float32", task_id: str = "t1", round: int = 1) -> Task:
    ref = BlobRef("/weights", "0" * 64, 1)
    return Task(task_id, round, SPEC, DEFINITION, ref, "/up", 2, 8, 0.1, 0.0, precision=precision)


def body(task: Task, value: float = 1.0) -> bytes:
    return weights.encode(
        {"w": np.full(2, value, np.float32)}, {"task_id": task.task_id, "num_samples": "10"}
    )


def open_round(uploads: Uploads, round: int = 1, needed: int = 2, buffered: bool = False) -> dict[str, Task]:
    """Open a round with a task for a and b, due in a minute."""
    tasks = {d: replace(toy_task(task_id=f"{d}{round}", round=round), deadline=9e9) for d in ("a", "b")}
    uploads.open(OpenRound(round, 0.0, 9e9, dict(tasks), needed, frozenset(), buffered))
    return tasks


def send(uploads: Uploads, device: str, task: Task, value: float = 1.0) -> None:
    data = body(task, value)
    uploads.receive_update(task.round, device, data, weights.sha256(data))


def test_an_update_of_a_closed_round_is_refused_and_the_round_keeps_what_came_before(tmp_path):
    uploads = uploads_of(tmp_path)
    tasks = open_round(uploads)
    send(uploads, "a", tasks["a"])
    closed, over = uploads.close()
    assert list(closed.updates) == ["a"] and closed.bytes_up == len(body(tasks["a"]))
    assert over == ["a", "b"], "every task of a round that does not carry them is over"
    with pytest.raises(NotWanted, match="^round 1 is not open"):
        send(uploads, "b", tasks["b"])
    assert uploads.open_round() is None and list(closed.updates) == ["a"]


def test_a_round_closed_while_an_update_was_checked_refuses_it(tmp_path):
    uploads = uploads_of(tmp_path)
    ceiling = uploads.sample_ceiling

    def closing(device_id: str) -> int:  # the round closes between the update's two looks at it
        uploads.close()
        return ceiling(device_id)

    uploads.sample_ceiling = closing
    tasks = open_round(uploads)
    with pytest.raises(NotWanted, match="^round 1 closed while the update was checked"):
        send(uploads, "a", tasks["a"])


def test_an_update_checked_while_others_filled_the_round_is_refused(tmp_path):
    uploads = uploads_of(tmp_path)
    ceiling = uploads.sample_ceiling
    tasks = open_round(uploads, needed=1)

    def filled(device_id: str) -> int:  # b's update comes in between a's two looks at the round
        if device_id == "a":
            send(uploads, "b", tasks["b"])
        return ceiling(device_id)

    uploads.sample_ceiling = filled
    with pytest.raises(NotWanted, match="^round 1 already has the 1 results it needs"):
        send(uploads, "a", tasks["a"])
    closed, _ = uploads.close()
    assert list(closed.updates) == ["b"], "the round's one result, not two"


def test_a_replayed_update_counts_once(tmp_path):
    uploads = uploads_of(tmp_path)
    tasks = open_round(uploads)
    send(uploads, "a", tasks["a"], 1.0)
    with pytest.raises(NotWanted, match="^a already sent its update for round 1"):
        send(uploads, "a", tasks["a"], 9.0)
    closed, _ = uploads.close()
    assert closed.updates["a"][0].arrays["w"][0] == 1.0


def test_a_buffered_rounds_late_update_counts_once_in_the_next_round_with_its_staleness(tmp_path):
    uploads = uploads_of(tmp_path)
    first = open_round(uploads, round=1, needed=1, buffered=True)
    send(uploads, "a", first["a"])
    closed, over = uploads.close()
    assert uploads.complete(closed), "the one result it needs"
    assert over == ["a"], "b trains on"
    assert uploads.carried() == {"b": first["b"].deadline}
    send(uploads, "b", first["b"], 5.0)  # between rounds: it waits for the next
    assert uploads.carried() == {}
    with pytest.raises(NotWanted, match="^round 1 is not open"):  # a replay counts once
        send(uploads, "b", first["b"], 50.0)
    second = open_round(uploads, round=2, needed=1, buffered=True)
    send(uploads, "a", second["a"])
    closed, over = uploads.close()
    result, record = closed.updates["b"]
    assert (result.staleness, result.arrays["w"][0], record.device_id) == (1, 5.0, "b")
    assert closed.bytes_up == 2 * len(body(first["a"]))
    assert over == ["a", "b"], "b's task is over once its update counted"


def test_a_device_whose_turn_passed_is_refused_and_only_its_relay_is_served(tmp_path):
    uploads = uploads_of(tmp_path)
    relay = BlobRef(routes.relay(1, 1), "0" * 64, 7)
    uploads.open(OpenRound(1, 0.0, 0.0, {}, 3, frozenset()))  # a chained round: tasks one by one
    passed = toy_task(task_id="a1")  # its deadline has passed
    uploads.add_task("a", passed)
    uploads.add_task("b", replace(toy_task(task_id="b1"), weights=relay, deadline=9e9))
    assert uploads.poll(["a", "b"]) == ({}, ["a"])
    with pytest.raises(NotWanted, match="^a is not the device training in its group now"):
        send(uploads, "a", passed)
    assert uploads.relay_file(1, 1, "b") == uploads.store.relay_path(1, 1)
    with pytest.raises(NotWanted, match="^a has no open task that trains from"):
        uploads.relay_file(1, 1, "a")
    send(uploads, "b", replace(toy_task(task_id="b1")))
    answered, late = uploads.poll(["b"])
    assert list(answered) == ["b"] and late == []
    closed, _ = uploads.close()
    assert closed.bytes_down == 7 and closed.skipped == {"a"}


def test_the_wait_for_a_round_ends_on_its_results(tmp_path):
    uploads = uploads_of(tmp_path)
    tasks = open_round(uploads, needed=2)
    threading.Timer(0.05, lambda: [send(uploads, d, t) for d, t in tasks.items()]).start()
    uploads.wait_until_complete(threading.Event())  # pytest's timeout, if it never returned
    closed, _ = uploads.close()
    assert sorted(closed.updates) == ["a", "b"]


def test_a_failure_report_ends_the_wait_for_its_device_alone_and_is_kept_escaped(tmp_path):
    uploads = uploads_of(tmp_path)
    tasks = open_round(uploads, needed=2)
    open_ = uploads._opened()
    for device, task in tasks.items():
        uploads.acknowledge(device, task.task_id)
    send(uploads, "a", tasks["a"])
    assert not uploads.complete(open_), "b took its task: the round waits for it"
    for device, task_id in (("a", tasks["b"].task_id), ("c", tasks["b"].task_id), ("b", "not-its-task")):
        with pytest.raises(NotWanted, match=f"^{device} has no open task"):
            uploads.fail(device, task_id, "forged")
    assert not uploads.complete(open_) and uploads.last_errors() == {}, "a refused report changes nothing"

    threading.Timer(0.05, uploads.fail, ["b", tasks["b"].task_id, "line\nforged line" + "x" * 500]).start()
    uploads.wait_until_complete(threading.Event())  # pytest's timeout, if it never returned
    error = uploads.last_errors()["b"]
    assert (error.round, error.task_id) == (1, tasks["b"].task_id)
    assert error.reason.startswith("line\\nforged linexxx") and len(error.reason) == 300
    closed, over = uploads.close()
    assert closed.never_taken == {"b"} and over == ["a", "b"]
    with pytest.raises(NotWanted):
        uploads.fail("b", tasks["b"].task_id, "again, once its round is over")
    assert uploads.last_errors()["b"] == error, "kept after its round"


def test_an_update_after_its_devices_own_failure_report_is_refused(tmp_path):
    """The round stopped waiting for a device on its word that it could not do its task: so it stays."""
    uploads = uploads_of(tmp_path)
    tasks = open_round(uploads, needed=2)
    uploads.acknowledge("b", tasks["b"].task_id)
    uploads.fail("b", tasks["b"].task_id, "out of memory")
    with pytest.raises(NotWanted, match="^b reported it could not do task b1$"):
        send(uploads, "b", tasks["b"])
    send(uploads, "a", tasks["a"])
    closed, _ = uploads.close()
    assert list(closed.updates) == ["a"] and closed.bytes_up == len(body(tasks["a"]))


def test_carried_tasks_are_dropped_when_their_device_leaves_their_deadline_passes_or_the_model_grows():
    def task(device: str, deadline: float, spec: ModelSpec = SPEC) -> Task:
        return Task(device, 1, spec, DEFINITION, BlobRef("/w", "0" * 64, 1), "/up", 2, 8, 0.1, deadline)

    late = LateUpdates()
    late.carried = {
        "kept": task("kept", 100.0),
        "offline": task("offline", 100.0),
        "expired": task("expired", 9.0),
        "grown": task("grown", 100.0, ModelSpec("toy", 8000, 8000, 2, depth=3)),
    }
    dropped = late.drop(["kept", "expired", "grown"], SPEC, now=10.0)
    assert sorted(dropped) == ["expired", "grown", "offline"]
    assert late.busy() == {"kept"}
    assert late.task("kept", 1, "kept") is late.carried["kept"]
    assert late.task("kept", 2, "kept") is None and late.task("kept", 1, "forged") is None


# -- the checks ----------------------------------------------------------------------------------------

REFERENCE = {"w": np.zeros(2, np.float32)}


def check(arrays, meta, task: Task, most: int) -> tuple:
    upload = Upload("a", arrays, meta, "d")
    return check_update(upload, task, reference=REFERENCE, most_samples=most, num_classes=2)


def test_an_update_in_the_tasks_precision_is_widened_and_counts_for_at_most_its_ceiling():
    half = {"w": np.full(2, 0.5, np.float16)}
    meta = {"num_samples": "50", "local_steps": str(10**12), "train_loss": "0.25"}
    result, record, claimed = check(half, meta, toy_task("float16"), 20)
    assert result.arrays["w"].dtype == np.float32 and result.arrays["w"][0] == 0.5
    assert (claimed, record.num_samples, result.num_samples) == (50, 20, 20)
    assert result.steps == 2 * 50, "at most the task's epochs over the samples claimed"
    assert (record.device_id, record.sha256, record.train_loss) == ("a", "d", 0.25)


@pytest.mark.parametrize(
    "arrays, error",
    [
        ({"w": np.zeros(2, np.float16)}, "bad update: w: dtype float16, expected float32"),
        ({"v": np.zeros(2, np.float32)}, "bad update: tensor names differ"),
        ({"w": np.zeros(3, np.float32)}, "bad update: w: shape"),
    ],
)
def test_an_update_unlike_the_global_model_in_the_tasks_precision_is_a_bad_upload(arrays, error):
    with pytest.raises(BadUpload, match=f"^{error}"):
        check(arrays, {"num_samples": "10"}, toy_task(), 10)


def test_an_update_of_a_device_that_registered_no_samples_is_a_bad_upload():
    with pytest.raises(BadUpload, match="^num_samples must be at least 1"):
        check(dict(REFERENCE), {"num_samples": "10"}, toy_task(), 0)


def full_round(buffered: bool = False) -> OpenRound:
    """Round 1 with tasks for a and b, needing one result, which a has sent."""
    tasks = {"a": toy_task(), "b": toy_task(task_id="t2")}
    open_ = OpenRound(1, 0.0, 60.0, tasks, needed=1, required=frozenset(), buffered=buffered)
    open_.updates["a"] = (None, None)  # only its presence counts
    return open_


def upload(device: str, task_id: str) -> Upload:
    return Upload(device, {}, {"task_id": task_id}, "d")


@pytest.mark.parametrize(
    "round, device, task_id, error",
    [
        (2, "b", "t2", "round 2 is not open"),
        (1, "b", "t1", "no open task 't1' for b"),
        (1, "c", "t2", "no open task 't2' for c"),
        (1, "a", "t1", "a already sent its update for round 1"),
        (1, "b", "t2", "round 1 already has the 1 results it needs"),
    ],
)
def test_an_upload_that_answers_no_wanted_task_is_not_wanted(round, device, task_id, error):
    with pytest.raises(NotWanted, match=f"^{error}"):
        answered_task(full_round(), LateUpdates(), round, upload(device, task_id))


def test_a_buffered_round_takes_a_result_past_its_count_and_a_carried_task_outlives_its_round():
    assert answered_task(full_round(buffered=True), LateUpdates(), 1, upload("b", "t2")).task_id == "t2"
    late = LateUpdates(carried={"c": toy_task()})
    assert answered_task(None, late, 1, upload("c", "t1")) is late.carried["c"]


def test_an_uploads_limit_is_known_before_its_body_is_read_and_only_for_a_device_with_a_task(tmp_path):
    uploads = uploads_of(tmp_path)
    with pytest.raises(NotWanted, match="round 1 is not open"):
        uploads.upload_limit(1, "a")
    tasks = open_round(uploads)
    # what the task downloaded, and a header: never the 64 MiB any upload may have
    assert uploads.upload_limit(1, "a") == tasks["a"].weights.size + bounds.MAX_WEIGHTS_HEADER_BYTES
    with pytest.raises(NotWanted, match="c has no open task in round 1"):
        uploads.upload_limit(1, "c")
    with pytest.raises(NotWanted, match="round 2 is not open"):
        uploads.upload_limit(2, "a")
    send(uploads, "a", tasks["a"])
    with pytest.raises(NotWanted, match="a already sent its update"):
        uploads.upload_limit(1, "a")
