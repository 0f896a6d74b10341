"""Each round mode alone, as the loop calls it: train(round, plan, context) with fake devices answering
through a real uploads over a real store; no loop, no broker, no HTTP."""

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from fedspeech.coordinator.config import RoundConfig
from fedspeech.coordinator.refusals import NotWanted
from fedspeech.coordinator.round.modes import MODES
from fedspeech.coordinator.round.modes.base import RoundContext, TaskMaker
from fedspeech.coordinator.strategies import RoundPlan, Work
from fedspeech.protocol import routes, weights
from fedspeech.protocol.messages import BlobRef, Task
from tests.helpers.fake_fleet import DEFINITION, SPEC, FakeLink, uploads_of

pytestmark = pytest.mark.timeout(30)

GLOBAL = BlobRef(routes.model(0, "weights"), "0" * 64, 1)  # where the fake tasks say the model is


def tasks_of(round: int) -> TaskMaker:
    """Tasks of a round that say they train from round 0's model."""

    def tasks(devices: Sequence[str], deadline: float) -> dict[str, Task]:
        return {
            d: Task(uuid.uuid4().hex, round, SPEC, DEFINITION, GLOBAL, "/up", 1, 8, 0.1, deadline)
            for d in devices
        }

    return tasks


def context_of(tmp_path, link: FakeLink, timeout_s: float = 5.0) -> RoundContext:
    """Round 1's context, starting now; its Uploads' global model is w = 1."""
    uploads = uploads_of(tmp_path, link)
    uploads.publish({"w": np.ones(2, np.float32)}, SPEC)
    config = RoundConfig(round_timeout=timeout_s)
    return RoundContext(time.time(), config, uploads, link, uploads.store, tasks_of(1), threading.Event())


def answer(context: RoundContext, device: str, task: Task, value: float, samples: int = 10) -> None:
    body = weights.encode(
        {"w": np.full(2, value, np.float32)}, {"task_id": task.task_id, "num_samples": str(samples)}
    )
    context.uploads.receive_update(task.round, device, body, weights.sha256(body))


def plan(devices: Sequence[str], needed: int, groups: list[list[str]] | None = None) -> RoundPlan:
    return RoundPlan({d: Work(1) for d in devices}, needed, groups=groups or [])


def test_parallel_waits_for_every_result_until_the_deadline_and_withdraws_every_task(tmp_path):
    link = FakeLink()
    context = context_of(tmp_path, link, timeout_s=0.3)
    link.responders["a"] = lambda task: answer(context, "a", task, 3.0)  # b never answers
    collected = MODES["parallel"](1, plan(["a", "b"], needed=2), context)
    assert time.time() - context.started >= 0.3, "closed at the deadline"
    assert [(r.device_id, r.arrays["w"][0]) for r in collected.results] == [("a", 3.0)]
    assert collected.missed and set(collected.closed.tasks) == {"a", "b"}
    assert link.cleared == ["a", "b"] and context.uploads.carried() == {}
    assert collected.devices_in(collected.results) == {"a"}


@pytest.mark.parametrize("mode", ["parallel", "buffered"])
def test_a_device_that_only_looks_online_holds_a_round_its_ack_timeout_not_its_deadline(tmp_path, mode):
    link = FakeLink()
    context = context_of(tmp_path, link, timeout_s=20.0)
    context.uploads.acks.timeout_s = 0.3
    link.responders["a"] = lambda task: answer(context, "a", task, 3.0)  # b is online and takes no task
    collected = MODES[mode](1, plan(["a", "b"], needed=2), context)
    assert time.time() - context.started < 10.0, "closed once b had not acknowledged its task in time"
    assert [r.device_id for r in collected.results] == ["a"] and not collected.missed
    assert collected.closed.never_taken == {"b"}
    assert context.uploads.carried() == {}, "a task never taken is not carried past its round"


def test_a_device_that_took_its_task_is_waited_for_until_the_deadline(tmp_path):
    link = FakeLink()
    context = context_of(tmp_path, link, timeout_s=1.0)
    context.uploads.acks.timeout_s = 0.1
    link.responders["a"] = lambda task: answer(context, "a", task, 3.0)
    taken: list[Task] = []

    def take(task: Task) -> None:  # b acknowledges its task, and answers never
        with pytest.raises(NotWanted, match="a has no open task"):
            context.uploads.acknowledge("a", task.task_id)  # not a's task to take
        context.uploads.acknowledge("b", task.task_id)
        taken.append(task)

    link.responders["b"] = take
    collected = MODES["parallel"](1, plan(["a", "b"], needed=2), context)
    assert time.time() - context.started >= 1.0, "closed at the deadline"
    assert collected.missed and len(taken) == 1 and collected.closed.never_taken == set()
    with pytest.raises(NotWanted, match="no open task"):
        context.uploads.acknowledge("b", taken[0].task_id)  # its round is over


def test_chained_skips_a_device_that_takes_no_task_at_its_ack_timeout(tmp_path):
    link = FakeLink()
    context = context_of(tmp_path, link, timeout_s=20.0)
    context.uploads.acks.timeout_s = 0.3
    link.responders["b"] = lambda task: answer(context, "b", task, 5.0)  # a is online and takes no task
    collected = MODES["chained"](1, plan(["a", "b"], needed=1, groups=[["a", "b"]]), context)
    assert time.time() - context.started < 10.0
    assert [(r.device_id, r.arrays["w"][0]) for r in collected.results] == [("b", 5.0)]


def fails(context: RoundContext, device: str, reason: str):
    """A device that takes its task, then reports it could not do it."""

    def respond(task: Task) -> None:
        context.uploads.acknowledge(device, task.task_id)
        context.uploads.fail(device, task.task_id, reason)

    return respond


@pytest.mark.parametrize("mode", ["parallel", "buffered", "chained"])
def test_a_device_that_reports_its_task_failed_holds_no_round(tmp_path, mode):
    link = FakeLink()
    context = context_of(tmp_path, link, timeout_s=20.0)
    context.uploads.acks.timeout_s = 20.0  # only the failure report ends the wait for b
    link.responders["a"] = lambda task: answer(context, "a", task, 3.0)
    link.responders["b"] = fails(context, "b", "no data folder /srv/clips")
    groups = [["b", "a"]] if mode == "chained" else None
    collected = MODES[mode](1, plan(["a", "b"], needed=2, groups=groups), context)
    assert time.time() - context.started < 10.0, "closed once a answered and b said it could not"
    assert [r.device_id for r in collected.results] == ["a"]
    if mode != "chained":  # one task each, the round over: b's failed task was never taken
        assert collected.closed.never_taken == {"b"} and not collected.missed
    assert context.uploads.carried() == {}, "a failed task is not carried past its round"
    error = context.uploads.last_errors()["b"]
    assert (error.round, error.reason) == (1, "no data folder /srv/clips")


def test_buffered_closes_on_its_results_and_counts_a_late_update_in_the_next_round_rebased(tmp_path):
    link = FakeLink()
    context = context_of(tmp_path, link)
    round_0 = {"w": np.zeros(2, np.float32)}
    context.store.save_model_file(0, "weights", weights.encode(round_0, {"round": "0"}))
    late: list[Task] = []
    link.responders["a"] = lambda task: answer(context, "a", task, 3.0)
    link.responders["b"] = late.append  # still training when round 1 closes
    first = MODES["buffered"](1, plan(["a", "b"], needed=1), context)
    assert time.time() - context.started < 1.0, "closed on its one result"
    assert [r.device_id for r in first.results] == ["a"] and not first.missed
    assert link.cleared == ["a"] and set(context.uploads.carried()) == {"b"}, "b trains on"
    answer(context, "b", late[0], 5.0)  # between rounds: it waits for round 2
    context = replace(context, started=time.time(), tasks=tasks_of(2))
    second = MODES["buffered"](2, plan(["a"], needed=2), context)  # a and b's late update
    results = {r.device_id: r for r in second.results}
    assert sorted(results) == ["a", "b"] and results["b"].staleness == 1
    # b's change from round 0's model (5 - 0) laid onto the global model (1)
    assert results["b"].arrays["w"][0] == pytest.approx(6.0)
    assert link.cleared == ["a", "a", "b"], "b's task is withdrawn once its update counted"


def test_chained_passes_each_groups_model_on_and_takes_one_result_per_group(tmp_path):
    link = FakeLink()
    context = context_of(tmp_path, link)
    started_from: dict[str, float] = {}

    def train_on(device: str, task: Task) -> None:  # one more than the model it starts from
        if task.weights == GLOBAL:
            start = 1.0
        else:
            step = int(task.weights.path.rsplit("/", 1)[1])
            path = context.uploads.relay_file(task.round, step, device)
            start = float(weights.decode(path.read_bytes())[0]["w"][0])
        started_from[device] = start
        answer(context, device, task, start + 1.0)

    for device in ("a", "b", "c"):
        link.responders[device] = lambda task, d=device: train_on(d, task)
    collected = MODES["chained"](1, plan(["a", "b", "c"], needed=2, groups=[["a", "b"], ["c"]]), context)
    assert started_from == {"a": 1.0, "b": 2.0, "c": 1.0}, "b starts from a's update"
    results = {r.device_id: (r.arrays["w"][0], r.num_samples) for r in collected.results}
    assert results == {"b": (3.0, 20), "c": (2.0, 10)}, "a group's model counts its samples"
    assert not collected.missed and sorted(collected.closed.updates) == ["a", "b", "c"]
    assert collected.devices_in([r for r in collected.results if r.device_id == "b"]) == {"a", "b"}
    assert sorted(link.cleared) == ["a", "b", "c"]
