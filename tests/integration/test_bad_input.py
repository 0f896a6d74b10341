"""Bad input is logged and rejected: the coordinator stays up and the global model stays as it was."""

import logging
from dataclasses import replace

import numpy as np
import pytest

from fedspeech.protocol import messages, weights
from fedspeech.protocol.messages import Credentials, DeviceStatus, Profile, Registration, Task
from tests.helpers.devices import one_round_coordinator
from tests.helpers.waiting import wait_for

DEVICE = "bench-device"


@pytest.fixture
def coordinator(tmp_path, mosquitto_url, topic_root):
    # the test's device answers training tasks only
    settings = {"eval_every": 0, "round_timeout": 120.0}
    with one_round_coordinator(tmp_path, mosquitto_url, topic_root, DEVICE, **settings) as running:
        yield running


def _upload(http, task: Task, token: str, body: bytes, digest: str | None = None):
    return http.post(
        task.upload_path,
        data=body,
        headers={"Authorization": f"Bearer {token}", "X-Content-SHA256": digest or weights.sha256(body)},
    )


def test_bad_uploads_and_messages_never_touch_the_global_model(coordinator, caplog):
    app, service, device = coordinator
    caplog.set_level(logging.INFO)
    http = app.test_client()
    wait_for(lambda: service.store.latest_round(), 60, "round 0")

    assert http.post("/api/devices", data=b"{not json").status_code == 400
    reply = http.post("/api/devices", data=messages.encode(Registration(DEVICE, 50, Profile(2, 0.0, 512.0))))
    token = messages.decode(reply.data, Credentials).token

    # Malformed status messages on the control plane are dropped.
    for payload in (
        b"\x00garbage",
        b'{"v": 1, "kind": "status"}',
        messages.encode(DeviceStatus("someone-else", "online")),
    ):
        device.publish(device.topics.status(DEVICE), payload)
    wait_for(lambda: caplog.text.count("dropped malformed status") >= 3, 10, "malformed statuses logged")
    assert DEVICE not in service.link.statuses()

    device.go_online(50)
    task = device.next_task(30)
    model_bytes = http.get(task.weights.path).data
    weights.check_digest(model_bytes, task.weights.sha256)
    global_arrays, _ = weights.decode(model_bytes)
    meta = {"task_id": task.task_id, "num_samples": "50"}

    def shifted(**replace) -> dict[str, np.ndarray]:
        return {k: replace.get(k, v + np.asarray(0.01, v.dtype)) for k, v in global_arrays.items()}

    name, first = next(iter(global_arrays.items()))

    def body(arrays=None, **meta_changes) -> bytes:
        return weights.encode(shifted() if arrays is None else arrays, {**meta, **meta_changes})

    wrong_round = replace(task, upload_path="/api/rounds/7/updates")
    bad = {
        "wrong token": (_upload(http, task, "not-a-token", body()), 401, "bearer token"),
        "no token": (http.post(task.upload_path, data=b"x"), 401, "bearer token"),
        "wrong digest": (_upload(http, task, token, body(), "0" * 64), 400, "sha256"),
        "corrupt blob": (
            _upload(http, task, token, b"\x10" + b"\x00" * 7 + b"{not safetensors"),
            400,
            "safetensors",
        ),
        "wrong shape": (
            _upload(http, task, token, body(shifted(**{name: first.reshape(-1)[:-1]}))),
            400,
            "shape",
        ),
        "missing tensor": (_upload(http, task, token, body({name: first})), 400, "names differ"),
        "NaN": (_upload(http, task, token, body(shifted(**{name: np.full_like(first, np.nan)}))), 400, "NaN"),
        "wrong task": (_upload(http, task, token, body(task_id="x")), 409, "task"),
        "no samples": (_upload(http, task, token, body(num_samples="0")), 400, "num_samples"),
        "400-digit samples": (_upload(http, task, token, body(num_samples=str(10**400))), 400, "num_samples"),
        "negative samples": (_upload(http, task, token, body(num_samples="-5")), 400, "num_samples"),
        "wrong round": (_upload(http, wrong_round, token, body()), 409, "not open"),
    }
    for case, (reply, status, reason) in bad.items():
        assert reply.status_code == status, case
        assert reason in reply.get_json()["error"], case
        assert reason in caplog.text, f"{case} is logged"

    assert service.thread.is_alive() and service.uploads.open_round() == 1
    assert [r.round for r in service.store.rounds()] == [0], "no bad update made a round"
    assert service.store.model_path(0, "weights").read_bytes() == model_bytes

    # it claims far more samples than the 50 it reported: it counts for 50
    good = weights.encode(shifted(), {**meta, "num_samples": str(10**12)})
    assert _upload(http, task, token, good).status_code == 200
    assert _upload(http, task, token, good).status_code == 409, "one update per device per round"
    wait_for(service.orchestrator.finished.is_set, 60, "the round to complete with the good update")
    new_arrays, _ = weights.decode(service.store.model_path(1, "weights").read_bytes())
    for k, v in shifted().items():
        np.testing.assert_allclose(new_arrays[k], v, rtol=1e-6)
    assert http.get("/api/status").get_json()["completed_round"] == 1
    assert [(u.device_id, u.num_samples) for u in service.store.updates(1)] == [(DEVICE, 50)]
    assert f"claims {10**12} samples; counted as 50" in caplog.text
    assert service.store.rounds()[1].bytes_up == len(good), "only the accepted body counts as traffic"
