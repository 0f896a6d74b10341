"""A token holder's burst of huge uploads against a real coordinator: refused before it is read.

The issue's attack: 16 uploads of 64 MiB raised the coordinator to 2.1 GB (1.1 GB still resident after),
and 4 uploads with 36 MB safetensors headers cost 24 s of CPU. Here a device that holds a token and an
open task sends the 16 at once (4 of them for a round it has no task in), then the 4 at once (2 chunked),
from a process of its own (fedspeech_bench/attacks/upload_burst.py); each is refused within 1 s of its headers
(no task; a declared size over what its task takes; first 8 bytes that announce a header too long to
parse), well before 64 MiB could be read (the 50 ms the issue asks for is measured and printed, not
asserted: a loaded machine's scheduler decides it), the coordinator's RSS stays within 200 MB of where
it was and is back within 10 s, and the device's honest upload is then taken.
"""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from fedspeech.protocol import routes
from fedspeech.protocol.topics import Topics
from fedspeech_bench.attacks.upload_burst import HEADER_COUNT, HUGE_COUNT, NO_TASK_COUNT
from tests.helpers.devices import ScriptedDevice, unchanged_update, upload
from tests.helpers.ports import free_port
from tests.helpers.waiting import get_json, wait_for

MiB = 1024 * 1024
REFUSED_WITHIN_MS, RSS_GROWTH_MB, BACK_WITHIN_S, BACK_MIB = 1000.0, 200, 10.0, 32
REPO = Path(__file__).parents[2]


@pytest.mark.alone  # times each refusal and samples the coordinator's memory
@pytest.mark.timeout(300)
def test_a_token_holders_burst_of_huge_uploads_is_refused_before_it_is_read(
    tmp_path, mosquitto_url, topic_root, processes
):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = processes.start(
        "coordinator", "coordinator", "--state", str(tmp_path / "state"), "--new-state", "--port", str(port),
        "--broker", mosquitto_url, "--topic-root", topic_root, "--open-enrolment", "--rounds", "1",
        "--min-devices", "1", "--min-results", "1", "--round-timeout", "300", "--eval-every", "0",
    )  # fmt: skip
    wait_for(lambda: get_json(f"{url}/api/status") or proc.poll() is not None, 90, "the coordinator to serve")
    assert proc.poll() is None, proc.log_path.read_text()[-2000:]
    device = ScriptedDevice("mallory", mosquitto_url, Topics(topic_root))
    try:
        device.register(url, 40)
        device.go_online(40)
        task = device.next_task(180)
        honest = unchanged_update(url, task, 40)
        coordinator = psutil.Process(proc.pid)
        time.sleep(2.0)  # the download's buffers settle
        before = coordinator.memory_info().rss
        peak, sampling = before, threading.Event()

        def sample() -> None:
            nonlocal peak
            while not sampling.wait(0.01):
                peak = max(peak, coordinator.memory_info().rss)

        sampler = threading.Thread(target=sample)
        sampler.start()
        cpu_before = sum(coordinator.cpu_times()[:2])
        attacker = [sys.executable, "-m", "fedspeech_bench.attacks.upload_burst", str(port), device.token]
        attacker += [task.upload_path, routes.updates(task.round + 1)]  # and a round it has no task in
        sent = subprocess.run(attacker, cwd=REPO, capture_output=True, text=True, timeout=120)
        sent_at = time.monotonic()
        burst_cpu = sum(coordinator.cpu_times()[:2]) - cpu_before
        settled = None
        while time.monotonic() - sent_at < BACK_WITHIN_S:
            if coordinator.memory_info().rss - before < BACK_MIB * MiB:
                settled = time.monotonic() - sent_at
                break
            time.sleep(0.1)
        sampling.set()
        sampler.join()
        after = coordinator.memory_info().rss
        status = upload(url, task.upload_path, device.token, honest)
    finally:
        device.close()
    assert sent.returncode == 0, sent.stderr[-2000:]
    bursts = json.loads(sent.stdout)
    for burst in bursts:
        times = sorted(u["ms"] for u in burst)
        print(
            f"{len(burst)} at once: statuses {[u['status'] for u in burst]}, refused in {times[0]:.1f} to "
            f"{times[-1]:.1f} ms (median {times[len(times) // 2]:.1f})"
        )
    growth, left = (peak - before) / MiB, (after - before) / MiB
    print(
        f"coordinator CPU {burst_cpu:.2f} s; RSS {before / MiB:.0f} MiB before, peak +{growth:.1f} MiB, "
        f"+{left:.1f} MiB after ({settled} s to within {BACK_MIB} MiB)"
    )
    # no task; over what its task takes; too large again; a header too long to parse
    expected = [
        [413] * (HUGE_COUNT - NO_TASK_COUNT) + [409] * NO_TASK_COUNT,
        [413, 400] * (HEADER_COUNT // 2),
    ]
    assert [[u["status"] for u in burst] for burst in bursts] == expected
    assert max(u["ms"] for burst in bursts for u in burst) < REFUSED_WITHIN_MS
    assert peak - before < RSS_GROWTH_MB * 1000 * 1000
    assert settled is not None, f"RSS not back within {BACK_WITHIN_S} s"
    assert status == 200, "and the device's honest upload is taken"
