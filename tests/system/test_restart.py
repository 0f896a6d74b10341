"""A coordinator killed with SIGKILL mid-training resumes from its last completed round."""

import signal
import time

from fedspeech.protocol.topics import Topics
from tests.helpers.devices import ScriptedDevice, start_clients
from tests.helpers.ports import free_port
from tests.helpers.waiting import get_json, wait_for

SPEAKERS = ["george", "lucas"]
ROUNDS = 4


def test_sigkill_mid_round_resumes_without_counting_a_round_twice(
    tmp_path, mosquitto_url, topic_root, processes
):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    coordinator_args = [
        "coordinator",
        "--state", str(tmp_path / "state"), "--new-state",
        "--broker", mosquitto_url,
        "--port", str(port),
        "--topic-root", topic_root,
        "--open-enrolment",
        "--rounds", str(ROUNDS),
        "--min-devices", "3",
        "--min-results", "3",
        "--eval-every", "0",  # the test's device answers training tasks only
        "--round-timeout", "120",
    ]  # fmt: skip
    first = processes.start("coordinator-1", *coordinator_args)
    wait_for(lambda: get_json(f"{url}/api/status"), 60, "the coordinator to serve")
    clients = start_clients(processes, SPEAKERS, url, mosquitto_url, topic_root, max_samples=40)
    # The third device is the test's: it answers round 1 and holds round 2 open until the kill.
    held = ScriptedDevice("held", mosquitto_url, Topics(topic_root))
    try:
        held.register(url, 40)
        held.go_online(40)
        assert held.send_back_unchanged(url, held.next_task(120), 40) == 200
        task = held.next_task(120)
        assert task.round == 2
        before = get_json(f"{url}/api/rounds")
        assert [r["round"] for r in before] == [0, 1]
        killed_at = time.time()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)

        second = processes.start("coordinator-2", *coordinator_args)
        restarted = held.next_task(120)
        assert restarted.round == 2 and restarted.task_id != task.task_id, "round 2 is run again"
        assert held.send_back_unchanged(url, task, 40) == 409, "the old task is refused"
        assert held.send_back_unchanged(url, restarted, 40) == 200
        for expected_round in (3, 4):
            next_task = held.next_task(120)
            assert next_task.round == expected_round
            assert held.send_back_unchanged(url, next_task, 40) == 200
        wait_for(lambda: (get_json(f"{url}/api/status") or {}).get("finished"), 120, "all rounds")
    finally:
        held.close()

    after = get_json(f"{url}/api/rounds")
    assert [r["round"] for r in after] == list(range(ROUNDS + 1)), "every round exactly once"
    assert after[:2] == before, "completed rounds are kept as they were"
    assert after[2]["started_at"] > killed_at, "the interrupted round is run again from scratch"
    assert all(r["results"] == 3 for r in after[1:])
    assert "resuming after round 1" in second.log_path.read_text()
    assert all(p.poll() is None for p in clients), "devices survive the coordinator's death"
