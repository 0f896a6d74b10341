"""The operator's view through Flask's test client: dashboard, overview, metrics, admin token and revoking."""

import base64
import socket
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedspeech.coordinator.app import create_app, serve
from fedspeech.coordinator.state.records import RoundRecord, UpdateRecord
from fedspeech.protocol import messages, routes, weights
from fedspeech.protocol.messages import TaskFailure
from tests.helpers.configs import coordinator_config
from tests.helpers.device_doubles import make_task

TOKEN = "an-admin-token-of-some-length-0123456789"


def _app(tmp_path, **settings):
    return create_app(coordinator_config(tmp_path, broker="mqtt://127.0.0.1:1883", **settings))


@pytest.fixture
def guarded(tmp_path):
    (tmp_path / "admin-token").write_text(TOKEN + "\n")
    (tmp_path / "admin-token").chmod(0o600)  # as the operator keeps it: no warning on the commands' output
    return _app(tmp_path, admin_token_file=tmp_path / "admin-token")


def _store_round(store, round, accuracy, wall_s, updates=()):
    blob = f"weights {round}".encode()
    record = RoundRecord(
        round, 1.0, 1.0 + wall_s, wall_s, 3, len(updates), accuracy, accuracy, 1.0 - accuracy,
        100 * round, 1000 * round, weights.sha256(blob), weights.sha256(b"onnx"), withdrawn=1, stragglers=0,
    )  # fmt: skip
    store.save_round(record, blob, b"onnx", [UpdateRecord(d, 10, 0.5, 1.0, "ab" * 32) for d in updates])
    return record


def test_the_dashboard_and_overview_work_with_no_rounds_and_no_data(tmp_path):
    http = _app(tmp_path).test_client()
    page = http.get("/")
    assert page.status_code == 200 and b'src="/assets/dashboard.js"' in page.data
    assert "script-src" not in page.headers["Content-Security-Policy"], "scripts only from the page's origin"
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert http.get("/assets/dashboard.js").status_code == 200
    overview = http.get("/api/overview").get_json()
    assert overview["devices"] == [] and overview["rounds"] == [] and overview["model"] is None
    assert overview["completed_round"] is None and overview["task"] == "fsdd"


def test_the_overview_lists_devices_rounds_and_the_model(tmp_path):
    app = _app(tmp_path)
    store = app.extensions["fedspeech"].store
    store.register_device(
        "kitchen", "t1", 40, {"cpu_count": 4, "cpu_freq_mhz": 1500.0, "ram_available_mb": 900.0}
    )
    store.enrol_device("hall", "secret")
    _store_round(store, 0, 0.1, 0.5)
    _store_round(store, 1, 0.6, 12.0, updates=["kitchen"])
    overview = app.test_client().get("/api/overview").get_json()
    devices = {d["device_id"]: d for d in overview["devices"]}
    assert devices["kitchen"]["rounds_joined"] == 1 and devices["kitchen"]["registered"]
    assert devices["kitchen"]["profile"]["cpu_count"] == 4 and not devices["kitchen"]["online"]
    assert devices["hall"]["enrolled"] and not devices["hall"]["registered"]
    assert [r["round"] for r in overview["rounds"]] == [0, 1] and overview["rounds"][1]["withdrawn"] == 1
    assert overview["model"]["round"] == 1 and overview["model"]["onnx_url"] == "/api/models/1/onnx"
    assert overview["model"]["onnx_bytes"] == len(b"onnx")


def test_metrics_agree_with_the_stored_rounds(tmp_path):
    app = _app(tmp_path)
    store = app.extensions["fedspeech"].store
    for round, (accuracy, wall) in enumerate([(0.1, 0.0), (0.5, 3.0), (0.7, 45.0)]):
        _store_round(store, round, accuracy, wall, updates=["a", "b"][:round])
    http = app.test_client()
    assert http.post("/api/rounds/2/updates", headers={"Authorization": "Bearer nobody's"}).status_code == 401
    families = {
        f.name: f for f in text_string_to_metric_families(http.get("/metrics").get_data(as_text=True))
    }
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert value[("fedspeech_rounds_completed_total", ())] == 2
    assert value[("fedspeech_latest_round", ())] == 2
    assert value[("fedspeech_updates_accepted_total", ())] == 3
    assert value[("fedspeech_bytes_total", (("direction", "up"),))] == 100 + 200
    assert value[("fedspeech_bytes_total", (("direction", "down"),))] == 1000 + 2000
    assert value[("fedspeech_round_duration_seconds_count", ())] == 2
    assert value[("fedspeech_round_duration_seconds_sum", ())] == 48.0
    assert value[("fedspeech_round_duration_seconds_bucket", (("le", "5.0"),))] == 1
    assert value[("fedspeech_accuracy", (("evaluation", "central"),))] == 0.7
    assert ("fedspeech_accuracy", (("evaluation", "federated"),)) not in value, "no federated evaluation"
    assert value[("fedspeech_updates_rejected_total", (("reason", "unauthorized"),))] == 1
    assert value[("fedspeech_updates_rejected_total", (("reason", "invalid"),))] == 0


def test_with_an_admin_token_only_its_holder_sees_the_fleet(guarded):
    http = guarded.test_client()
    for path in ("/", "/api/overview", "/metrics", "/api/devices", "/api/rounds", "/assets/dashboard.js"):
        refused = http.get(path)
        assert refused.status_code == 401, path
        assert refused.headers["WWW-Authenticate"].startswith("Basic "), "a browser asks for the token"
        assert http.get(path, headers={"Authorization": "Bearer wrong-token-wrong-token"}).status_code == 401
        assert http.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200, path
    basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    assert http.get("/api/overview", headers={"Authorization": f"Basic {basic}"}).status_code == 200
    garbage = http.get("/api/overview", headers={"Authorization": "Basic %%%not-base64"})
    assert garbage.status_code == 401
    assert http.get("/api/status").status_code == 200, "devices measure their round trip on it"
    assert http.get("/api/task").status_code == 200, "devices start from it"


def test_revoking_over_http_needs_the_admin_token(guarded, tmp_path):
    store = guarded.extensions["fedspeech"].store
    store.register_device("kitchen", "kitchen-token", 40, {})
    http = guarded.test_client()
    assert http.delete("/api/devices/kitchen").status_code == 401
    assert (
        http.delete("/api/devices/kitchen", headers={"Authorization": "Bearer kitchen-token"}).status_code
        == 401
    )
    admin = {"Authorization": f"Bearer {TOKEN}"}
    assert http.delete("/api/devices/kitchen", headers=admin).get_json() == {"revoked": "kitchen"}
    assert store.device_for_token("kitchen-token") is None
    upload = http.post("/api/rounds/1/updates", headers={"Authorization": "Bearer kitchen-token"})
    assert upload.status_code == 401, "its token no longer works"
    assert http.delete("/api/devices/kitchen", headers=admin).status_code == 404

    open_app = _app(tmp_path / "open")
    open_app.extensions["fedspeech"].store.register_device("hall", "hall-token", 4, {})
    refused = open_app.test_client().delete("/api/devices/hall")
    assert refused.status_code == 403 and "--admin-token-file" in refused.get_json()["error"]
    assert open_app.extensions["fedspeech"].store.device("hall") is not None


@pytest.mark.parametrize(
    "content", ["", "short", "has spaces in the middle of it, which no token has", "a" * 20 + "b" * 20]
)
def test_an_unusable_admin_token_file_stops_the_coordinator(tmp_path, content):
    path = tmp_path / "admin-token"
    path.write_text(content)
    with pytest.raises(ValueError, match="at least 32 printable characters, 16 of them different"):
        _app(tmp_path, admin_token_file=path)
    with pytest.raises(ValueError, match="cannot read the admin token file"):
        _app(tmp_path, admin_token_file=tmp_path / "missing")


def test_a_rejected_upload_shows_on_its_device_with_the_reason(tmp_path):
    app = _app(tmp_path)
    store = app.extensions["fedspeech"].store
    store.register_device("kitchen", "kitchen-token", 40, {})
    _store_round(store, 0, 0.1, 0.5)
    http = app.test_client()
    headers = {"Authorization": "Bearer kitchen-token"}
    refused = http.post("/api/rounds/3/updates", headers=headers, data=b"<script>x</script>")
    assert refused.status_code == 409  # no open task: refused before its body is read
    kitchen = http.get("/api/overview").get_json()["devices"][0]
    assert kitchen["last_update"]["round"] == 3 and not kitchen["last_update"]["accepted"]
    assert kitchen["last_update"]["reason"]


def test_a_task_a_device_could_not_do_shows_on_it_with_the_reason(tmp_path):
    app = _app(tmp_path)
    service = app.extensions["fedspeech"]
    service.store.register_device("kitchen", "kitchen-token", 40, {})
    service.store.register_device("hall", "hall-token", 40, {})
    task = make_task("task-1", blob=b"weights")
    service.uploads.acks.expect([("kitchen", task)])  # handed out, as a round does
    http = app.test_client()
    report = messages.encode(TaskFailure("no data folder /srv/clips\n<script>x</script>"))
    path = routes.failure("task-1")
    assert http.post(path, data=report, headers={"Authorization": "Bearer hall-token"}).status_code == 409
    assert http.get("/api/overview").get_json()["devices"][0]["last_error"] is None, "not hall's to report"
    assert http.post(path, data=report, headers={"Authorization": "Bearer kitchen-token"}).status_code == 200
    devices = {d["device_id"]: d for d in http.get("/api/overview").get_json()["devices"]}
    assert devices["hall"]["last_error"] is None
    error = devices["kitchen"]["last_error"]
    assert (error["round"], error["reason"]) == (1, "no data folder /srv/clips\\n<script>x</script>")
    assert http.get("/api/status").get_json()["device_errors"]["kitchen"] == error
    assert b"<th>Last error</th>" in http.get("/").data
    js = http.get("/assets/dashboard.js").data
    assert b"d.last_error" in js and b"innerHTML" not in js  # set as text, as every value


def _fedspeech(*args):
    return subprocess.run(
        [sys.executable, "-m", "fedspeech", *args], capture_output=True, text=True, timeout=60
    )


def test_status_and_revoke_from_the_command_line_with_the_admin_token(guarded, tmp_path):
    store = guarded.extensions["fedspeech"].store
    store.register_device("kitchen", "kitchen-token", 40, {})
    store.register_device("hall", "hall-token", 12, {})
    _store_round(store, 0, 0.1, 0.5)
    _store_round(store, 1, 0.6, 12.0, updates=["kitchen"])
    server = serve(guarded, "127.0.0.1", 0)
    token = ["--admin-token-file", str(tmp_path / "admin-token")]
    try:
        refused = _fedspeech("status", "--coordinator", server.url)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1
        assert refused.stderr.startswith("fedspeech status: ") and "--admin-token-file" in refused.stderr

        shown = _fedspeech("status", "--coordinator", server.url, *token)
        assert shown.returncode == 0, shown.stderr
        rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines() if line}
        assert rows["kitchen"][1:4] == ["offline", "-", "40"] and rows["hall"][1] == "offline"
        assert rows["1"][:3] == ["1", "3", "1"], "round 1: 3 selected, 1 finished"

        revoked = _fedspeech("devices", "revoke", "kitchen", "--coordinator", server.url, *token)
        assert revoked.returncode == 0 and "revoked kitchen" in revoked.stdout
        assert store.device("kitchen") is None and store.device("hall") is not None
        again = _fedspeech("devices", "revoke", "kitchen", "--coordinator", server.url, *token)
        assert (
            again.returncode == 1
            and again.stderr == "fedspeech devices: the coordinator answered 404: no device 'kitchen'\n"
        )
    finally:
        server.stop()


def test_status_says_in_one_line_when_no_coordinator_answers(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _fedspeech("status", "--coordinator", f"http://127.0.0.1:{port}")
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(
        f"fedspeech status: cannot reach the coordinator at http://127.0.0.1:{port}"
    )
