"""The operator's view through Flask's test client: dashboard, overview, metrics, admin token and revoking."""

import base64
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedspeech.coordinator.app import create_app, serve
from fedspeech.coordinator.model.pretraining import init_in_words
from fedspeech.coordinator.round import new_model
from fedspeech.coordinator.round.new_model import FIRST_MODEL_KEY, RoundTally
from fedspeech.coordinator.state.records import DeviceEvaluation, RoundRecord, UpdateRecord
from fedspeech.protocol import messages, routes, weights
from fedspeech.protocol.messages import DeviceStatus, TaskFailure
from fedspeech_bench.dashboard_polling import chromium
from tests.helpers.configs import coordinator_config
from tests.helpers.device_doubles import make_task
from tests.helpers.waiting import wait_for

TOKEN = "an-admin-token-of-some-length-0123456789"


def _app(tmp_path, **settings):
    return create_app(coordinator_config(tmp_path, broker="mqtt://127.0.0.1:1883", **settings))


@pytest.fixture
def guarded(tmp_path):
    (tmp_path / "admin-token").write_text(TOKEN + "\n")
    (tmp_path / "admin-token").chmod(0o600)  # as the operator keeps it: no warning on the commands' output
    return _app(tmp_path, admin_token_file=tmp_path / "admin-token")


def _store_round(
    store, round, accuracy, wall_s, updates=(), central=True, started=1.0, made="random weights"
):
    """A round stored as the orchestrator stores it; central=False: the coordinator has no held-out set;
    round 0's weights say how they were made (made), or nothing, as before they did (None).
    """
    blob = f"weights {round}".encode()
    if round == 0 and made is not None:
        blob = weights.encode({"w": np.zeros(1, np.float32)}, {FIRST_MODEL_KEY: made})
    scores = (accuracy, accuracy, 1.0 - accuracy) if central else (None, None, None)
    record = RoundRecord(
        round, started, started + wall_s, wall_s, 3, len(updates), *scores,
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


def _round_0(app) -> str | None:
    """Store round 0 as the orchestrator does for a new fleet; the overview's words on how it was made."""
    store, orchestrator = app.extensions["fedspeech"].store, app.extensions["fedspeech"].orchestrator
    first = orchestrator.first_model()
    new_model.store_round(store, orchestrator.model, 0, first, RoundTally(time.time()), None)
    return app.test_client().get("/api/overview").get_json()["first_model"]


def test_the_overview_says_how_round_0_was_made_and_still_does_after_a_restart(tmp_path):
    assert _round_0(_app(tmp_path / "random")) == "random weights"
    restarted = _app(tmp_path / "random").test_client().get("/api/overview").get_json()
    assert restarted["completed_round"] == 0 and restarted["first_model"] == "random weights"
    first = tmp_path / "first.safetensors"
    orchestrator = _app(tmp_path / "random").extensions["fedspeech"].orchestrator
    first.write_bytes(weights.encode(orchestrator.first_model()))
    assert _round_0(_app(tmp_path / "read", init=str(first))) == f"weights read from {first}"
    again = _app(tmp_path / "read", init=str(first)).test_client().get("/api/overview").get_json()
    assert again["first_model"] == f"weights read from {first}"
    # a state whose round 0 was stored before its weights said how: not known
    _store_round(_app(tmp_path / "old").extensions["fedspeech"].store, 0, 0.1, 0.5, made=None)
    assert _app(tmp_path / "old").test_client().get("/api/overview").get_json()["first_model"] is None
    assert init_in_words("synthetic", None) == "trained on the task's words in synthetic speech"
    assert init_in_words("synthetic", Path("/srv/takes")).endswith("and on the clips in /srv/takes")
    assert init_in_words("random", Path("/srv/takes")) == "trained on the clips in /srv/takes"
    assert init_in_words("/srv/first.safetensors", None) == "weights read from /srv/first.safetensors"


ROUNDS_STORED = 25  # more than the page's 20 a page
LABELS = [str(digit) for digit in range(10)]


def _recorded_fleet(tmp_path, monkeypatch):
    """An app (not started) on a stored run of 25 rounds with no central held-out set, evaluated on the
    devices; kitchen lacks most labels and still fails its tasks, hall failed once and uploaded since.
    """
    app = _app(tmp_path)
    service = app.extensions["fedspeech"]
    for device in ("kitchen", "hall", "porch"):
        service.store.register_device(device, f"{device}-token", 40, {})
    for round in range(ROUNDS_STORED + 1):
        _store_round(service.store, round, 0.5, 3.0, ["kitchen", "hall"][: min(round, 2)], False, time.time())
        reports = [
            DeviceEvaluation("kitchen", 20, 10 + round // 5, 9.0),
            DeviceEvaluation("hall", 20, 15, 8.0),
        ]
        service.store.save_evaluation(round, 2, (0.5 + round / 100, 0.5, 1.0 - round / 50), reports)
    statuses = {
        "kitchen": DeviceStatus("kitchen", "online", 5, train_counts={"0": 3, "1": 2}, test_counts={"2": 1}),
        "hall": DeviceStatus("hall", "online", 40, train_counts=dict.fromkeys(LABELS, 4)),
    }  # porch has sent no status
    monkeypatch.setattr(service.link, "statuses", lambda: statuses)
    service.uploads.acks.expect(
        [("kitchen", make_task("task-k", blob=b"w")), ("hall", make_task("task-h", blob=b"w"))]
    )
    service.uploads.fail("kitchen", "task-k", "no data folder /srv/clips")
    service.uploads.fail("hall", "task-h", "out of memory")
    time.sleep(0.01)
    service.outcomes.accepted("hall", ROUNDS_STORED)  # hall recovered
    return app


def test_the_overview_lists_a_devices_missing_labels_and_forgets_an_error_it_recovered_from(
    tmp_path, monkeypatch
):
    http = _recorded_fleet(tmp_path, monkeypatch).test_client()
    overview = http.get("/api/overview").get_json()
    devices = {d["device_id"]: d for d in overview["devices"]}
    assert devices["kitchen"]["missing_labels"] == LABELS[3:], (
        "the none class is trained on noise: not missing"
    )
    assert devices["hall"]["missing_labels"] == [] and devices["porch"]["missing_labels"] is None
    assert devices["kitchen"]["last_error"]["reason"] == "no data folder /srv/clips"
    assert devices["hall"]["last_error"] is None, "an upload accepted since"
    assert devices["hall"]["last_update"]["accepted"]
    errors = http.get("/api/status").get_json()["device_errors"]  # `fedspeech status` shows these
    assert set(errors) == {"kitchen"}, errors


def _texts(driver, selector):
    """The text of every element the selector finds, read at once (the page redraws as it polls)."""
    script = "return [...document.querySelectorAll(arguments[0])].map((e) => e.textContent)"
    return driver.execute_script(script, selector)


def _shown(driver, selector):
    """Whether the element the selector finds is shown."""
    return driver.execute_script("return !document.querySelector(arguments[0]).hidden", selector)


@pytest.mark.xdist_group("chromium")  # one headless browser at a time on this machine
@pytest.mark.skipif(
    not shutil.which("chromium"), reason="needs Chromium: apt-get install chromium chromium-driver"
)
def test_the_page_explains_its_figures_and_reaches_every_round(tmp_path, monkeypatch):
    server = serve(_recorded_fleet(tmp_path, monkeypatch), "127.0.0.1", 0)
    driver = chromium(1400, 1000)
    try:
        driver.get(server.url + "/")
        wait_for(lambda: _texts(driver, "#devices tbody tr"), 15, "the page to draw the fleet")
        for chart in ("#accuracy-chart", "#loss-chart"):
            assert (
                len(_texts(driver, f"{chart} text.tick.x")) >= 3
                and len(_texts(driver, f"{chart} text.tick.y")) >= 3
            )
            assert _texts(driver, f"{chart} .axis-title.x") == ["round"] and _texts(
                driver, f"{chart} line.grid"
            )
        assert _texts(driver, "#accuracy-chart text.tick.y") == ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]
        assert _texts(driver, "#accuracy-chart text.tick.x") == ["0", "5", "10", "15", "20", "25"]
        assert _texts(driver, "#accuracy-chart .axis-title.y") == ["accuracy (0 to 1)"]
        legend = _texts(driver, "#accuracy-legend .key")
        assert legend == ["federated (devices' own speakers' held-out clips)"], (
            "no entry for central: no data"
        )
        assert not _texts(driver, "#accuracy-chart .central") and not _texts(driver, "#loss-legend .central")

        now = _texts(driver, "#accuracy-now")[0]
        assert (
            f"round {ROUNDS_STORED}'s model: 0.7500 federated, on held-out clips of the devices' own speakers"
            in now
        )
        assert "(2 devices, 40 clips); no central held-out set" in now and _shown(driver, "#accuracy-note")
        assert "speakers it has never heard" in _texts(driver, "#accuracy-note")[0]
        assert _texts(driver, "#first-model") == [
            "Round 0 is the first model, before any device trained: random weights."
        ]
        assert (
            "Hardware score" in _texts(driver, "#devices th")
            and "Hardware score: how fast" in _texts(driver, "#score-note")[0]
        )

        missing = dict(
            zip(_texts(driver, "#devices .device-id"), _texts(driver, "#devices .missing"), strict=True)
        )
        assert missing == {"kitchen": ", ".join(LABELS[3:]), "hall": "none", "porch": "–"}
        errors = dict(
            zip(_texts(driver, "#devices .device-id"), _texts(driver, "#devices .last-error"), strict=True)
        )
        assert errors == {"kitchen": "round 1: no data folder /srv/clips", "hall": "none", "porch": "none"}

        rounds = lambda: [int(r.split()[0]) for r in _texts(driver, "#rounds tbody td:first-child")]  # noqa: E731
        assert rounds() == list(range(ROUNDS_STORED, ROUNDS_STORED - 20, -1)), "the newest 20, newest first"
        assert _texts(driver, "#rounds-shown") == [f"rounds 6 to 25 of {ROUNDS_STORED + 1}"]
        driver.find_element("id", "rounds-older").click()
        assert rounds() == list(range(5, -1, -1)) and "0 (first model)" in _texts(driver, "#rounds td")
        assert not driver.find_element("id", "rounds-older").is_enabled()
        driver.find_element("id", "rounds-newer").click()
        assert rounds()[0] == ROUNDS_STORED
        driver.find_element("id", "rounds-all").click()
        assert rounds() == list(range(ROUNDS_STORED, -1, -1))
        time.sleep(2.5)  # a poll redraws the page: what the operator chose stays
        assert rounds() == list(range(ROUNDS_STORED, -1, -1)) and not _shown(driver, "#rounds-earlier")
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"], "no script errors"
    finally:
        driver.quit()
        server.stop()
