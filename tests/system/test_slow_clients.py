"""64 slow clients on another host against the coordinator's HTTP API, while a device trains a round.

The issue's attack: clients that send one byte of their request now and then, in the headers or in a
registration's body. Sixteen of them stopped the API when each held one of sixteen threads. Here 64 run
from another test host (a network namespace) for SLOW_S seconds (the issue's 60 s show nothing more: a
slow client costs a coroutine however long it lasts), and this host's honest requests, the
status the dashboard polls and the device's upload, must each be answered within a second throughout;
the slow host holds no more than its cap of connections, and none past its deadline.
"""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fedspeech.coordinator.app import serve
from tests.helpers.devices import one_round_coordinator, unchanged_update, upload
from tests.helpers.test_hosts import other_host
from tests.helpers.waiting import wait_for

SLOW_CLIENTS, SLOW_S, PERIOD_S = 64, 12.0, 1.0
TIMEOUT_S, PER_CLIENT = 4.0, 32
REPO = Path(__file__).parents[2]


def _timed(call) -> tuple[object, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def _status(url: str) -> int:
    with urllib.request.urlopen(f"{url}/api/status", timeout=10) as reply:
        reply.read()
        return reply.status


def test_slow_clients_on_another_host_cannot_stop_the_api(tmp_path, mosquitto_url, topic_root):
    settings = {"eval_every": 0, "round_timeout": 120.0}
    settings |= {"http_timeout": TIMEOUT_S, "http_connections_per_client": PER_CLIENT}
    with (
        other_host() as slow_host,
        one_round_coordinator(tmp_path, mosquitto_url, topic_root, "kitchen", **settings) as (
            app,
            service,
            device,
        ),
    ):
        server = serve(app, slow_host.here, 0)  # this host's address on the link: both hosts reach it
        try:
            wait_for(lambda: service.store.latest_round(), 120, "round 0")
            device.register(server.url, 40)
            device.go_online(40)
            task = device.next_task(60)
            body = unchanged_update(server.url, task, 40)
            slow = subprocess.Popen(
                slow_host.command(
                    sys.executable, "-m", "fedspeech_bench.attacks.slow_clients",
                    slow_host.here, str(server.port),
                    "--count", str(SLOW_CLIENTS), "--period", str(PERIOD_S), "--seconds", str(SLOW_S),
                ),
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                time.sleep(1.5)  # the slow clients are connected
                attacked = time.monotonic()
                answers, uploaded = [], None
                while time.monotonic() - attacked < SLOW_S - 2.5:
                    answers.append(_timed(lambda: _status(server.url)))
                    if uploaded is None and time.monotonic() - attacked > SLOW_S / 2:
                        uploaded = _timed(lambda: upload(server.url, task.upload_path, device.token, body))
                        uploaded_at = time.time()
                    time.sleep(0.2)
                out, err = slow.communicate(timeout=SLOW_S + 30)
            finally:
                if slow.poll() is None:
                    slow.kill()
                    slow.wait()
            wait_for(service.orchestrator.finished.is_set, 60, "the round to complete")
            record = service.store.latest_round()
        finally:
            server.stop()
    if not out.strip():
        pytest.fail(f"the slow clients reported nothing: {err[-2000:]}")
    seen = json.loads(out.strip().splitlines()[-1])
    slowest = max(seconds for _, seconds in answers)
    print(
        f"{len(answers)} honest GET /api/status, slowest {slowest:.3f} s; upload {uploaded}; "
        f"slow host: {seen}; round 1 stored {record.finished_at - uploaded_at:.1f} s after the upload"
    )
    assert all(status == 200 for status, _ in answers) and slowest < 1.0
    assert uploaded is not None and uploaded[0] == 200 and uploaded[1] < 1.0
    assert record.round == 1 and record.results == 1
    assert seen["refused"] > 0, f"the slow host holds at most {PER_CLIENT} connections; the rest are closed"
    assert seen["longest_open_s"] < TIMEOUT_S + 1.0, "no connection outlives its deadline"
