"""A live fleet under attack: each of the probe's attacks fails with a logged reason while the fleet trains.

A coordinator with closed enrolment, two enrolled device daemons and an enrolled but compromised device
(the test speaks for it), all real processes on the real broker. A stranger on the network tries to take
a device over, to send a task and to serve an old or foreign model; the compromised device sends an
absurd sample count. The chunked body and the half-open connection are in test_http_limits.py.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.protocol import messages, signing
from fedspeech.protocol.messages import BlobRef, ModelAnnouncement, Registration, Task
from fedspeech.protocol.topics import Topics
from fedspeech_bench.attacks.strangers import Stranger
from tests.helpers.devices import ScriptedDevice, post, unchanged_update, upload
from tests.helpers.ports import free_port
from tests.helpers.waiting import get_json, wait_for

ROUNDS = 5
DEVICES = ["jackson", "george"]


def _enrol(device: str, state, folder) -> str:
    """`fedspeech devices add ID --secret-file FILE` as the operator runs it (the first makes the state)."""
    path = folder / f"{device}.secret"
    subprocess.run(
        [sys.executable, "-m", "fedspeech", "devices", "add", device, "--state", str(state), "--new-state",
         "--secret-file", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return str(path)


def _upload(url: str, device: ScriptedDevice, task: Task, num_samples: str) -> int:
    """Upload the task's model back unchanged, claiming num_samples (a string, as in the metadata)."""
    return upload(url, task.upload_path, device.token, unchanged_update(url, task, num_samples))


@pytest.mark.timeout(600)
def test_the_probes_attacks_fail_while_the_fleet_trains(tmp_path, mosquitto_url, topic_root, processes):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state, topics = tmp_path / "state", Topics(topic_root)
    secrets = {device: _enrol(device, state, tmp_path) for device in [*DEVICES, "mallory"]}
    common = ["--broker", mosquitto_url, "--topic-root", topic_root]
    coordinator = processes.start(
        "coordinator", "coordinator", "--state", str(state), "--port", str(port), *common,
        "--rounds", str(ROUNDS), "--min-devices", "3", "--min-results", "3", "--round-timeout", "120",
        "--epochs", "1", "--eval-every", "0",
    )  # fmt: skip
    wait_for(lambda: get_json(f"{url}/api/status"), 60, "the coordinator to serve")
    stranger = Stranger(mosquitto_url, topics)
    other_key = Ed25519PrivateKey.generate()  # a stranger's own key: its signatures are not the coordinator's
    clients = {
        device: processes.start(
            f"client-{device}",
            "client",
            "--speaker",
            device,
            "--coordinator",
            url,
            *common,
            "--max-samples",
            "40",
            "--state",
            str(tmp_path / "devices"),
            "--enrolment-secret-file",
            secrets[device],
            "--model-dir",
            str(tmp_path / "models" / device),
        )  # fmt: skip
        for device in DEVICES
    }
    # the compromised device: enrolled, so it may upload; it lies about its sample count
    mallory = ScriptedDevice("mallory", mosquitto_url, topics)
    try:
        mallory.register(url, 40, credential=Path(secrets["mallory"]).read_text().strip())
        mallory.go_online(40)

        # 1. The takeover: a stranger registers an enrolled device's id, with no credential or a guessed one.
        takeover = messages.encode(Registration("jackson", 1_000_000, messages.Profile(1, 0.0, 256.0)))
        assert post(f"{url}/api/devices", takeover, {}) == 401
        assert post(f"{url}/api/devices", takeover, {"Authorization": "Bearer " + "x" * 43}) == 401

        # 2. The oversized sample count: refused, then an honest upload of the same task is taken.
        task = mallory.next_task(180)
        assert _upload(url, mallory, task, "1" + "0" * 400) == 400
        assert _upload(url, mallory, task, "40") == 200

        # 3. A forged task for a device (unsigned, endless epochs, uploading elsewhere); not retained, so
        #    that it does not replace the coordinator's real task on the topic.
        forged = json.loads(messages.encode(task))
        forged.update(epochs=100_000, task_id="forged")
        stranger.publish(topics.task("jackson"), json.dumps(forged).encode())
        forged.update(epochs=2, upload_path=":18081/api/rounds/1/updates")
        stranger.publish(
            topics.task("jackson"),
            signing.sign(other_key, topics.task("jackson"), json.dumps(forged).encode()),
        )

        # 4. The port-choosing announcement and the rollbacks, once a second model has been announced.
        for r in range(2, ROUNDS + 1):
            task = mallory.next_task(180)
            assert _upload(url, mallory, task, "40") == 200
            if r == 3:
                wait_for(lambda: 2 in stranger.announcements, 60, "round 2's announcement")
                ref = BlobRef("/api/models/0/onnx", "0" * 64, 1000)
                foreign = ModelAnnouncement(99999, task.spec, task.definition.labels, ref, ref)
                port_choosing = messages.encode(foreign).replace(b'"/api/models', b'":18081/api/models')
                stranger.publish(topics.model, port_choosing)
                stranger.publish(topics.model, messages.encode(foreign))  # unsigned, round 99999
                stranger.publish(topics.model, stranger.announcements[1])  # genuine, but an older round
        wait_for(lambda: (get_json(f"{url}/api/status") or {}).get("finished"), 240, "all rounds")
    finally:
        mallory.close()
        stranger.close()

    rounds = get_json(f"{url}/api/rounds")
    assert [r["round"] for r in rounds] == list(range(ROUNDS + 1)), "every round, once"
    for r in range(1, ROUNDS + 1):
        updates = {u["device_id"]: u for u in get_json(f"{url}/api/rounds/{r}")["updates"]}
        assert set(updates) == {*DEVICES, "mallory"}, f"round {r}: the devices kept training"
        assert updates["mallory"]["num_samples"] == 40
    assert all(p.poll() is None for p in clients.values()), "no device died"
    for device in DEVICES:  # each keeps the newest real model, never an older or a foreign one
        kept = json.loads((tmp_path / "models" / device / "model.json").read_text())
        assert kept["round"] == ROUNDS

    log = coordinator.log_path.read_text()
    # both takeovers (no credential, a guessed one) get the answer an id that is not enrolled gets
    refused = "registration refused: device jackson is not enrolled, or its token or enrolment secret"
    assert log.count(refused) >= 2
    assert "POST /api/rounds/1/updates rejected (400)" in log
    for device in DEVICES:
        text = clients[device].log_path.read_text()
        assert text.count("dropping a model announcement: not a signed message") >= 2, device
        assert "round 1: ignoring it, round" in text, device
        assert "18081" not in text.replace("dropping", ""), device
    jackson = clients["jackson"].log_path.read_text()
    assert "dropping a task: not a signed message" in jackson
    assert "dropping a task: bad signature" in jackson
    assert "task forged" not in jackson
