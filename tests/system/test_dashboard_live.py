"""The operator's view of a live fleet: the dashboard in headless Chromium, /metrics and `fedspeech status`.

One coordinator and three real device processes over Mosquitto, shared by the tests of this module.
"""

import os
import shutil
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedspeech.coordinator.app import create_app, serve
from fedspeech.protocol import messages
from fedspeech.protocol.messages import Profile, Registration
from fedspeech_bench.dashboard_polling import chromium, shown_round
from tests.helpers.configs import coordinator_config
from tests.helpers.devices import Processes, start_clients
from tests.helpers.waiting import get_json, wait_for

SPEAKERS = ["george", "jackson", "theo"]
ROUNDS = 2
# where the browser test leaves its screenshot: the README shows it (deploy/dashboard.png)
SCREENSHOT_DIR = os.environ.get("FEDSPEECH_SCREENSHOT_DIR")
# one headless browser at a time on this machine (and the module's fleet started once)
pytestmark = pytest.mark.xdist_group("chromium")
needs_chromium = pytest.mark.skipif(
    not shutil.which("chromium"), reason="needs Chromium: apt-get install chromium chromium-driver"
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, mosquitto_url):
    """A coordinator serving HTTP and three device processes; yields (service, URL), rounds under way."""
    tmp = tmp_path_factory.mktemp("fleet")
    topic_root = f"fedspeech-test/{uuid.uuid4().hex[:12]}"
    config = coordinator_config(
        tmp,
        broker=mosquitto_url,
        topic_root=topic_root,
        eval_corpus="fsdd",
        eval_limit=60,
        rounds=ROUNDS,
        min_devices=len(SPEAKERS),
        open_enrolment=True,
        round_timeout=120.0,
    )
    app = create_app(config)
    service = app.extensions["fedspeech"]
    service.start()
    server = serve(app, "127.0.0.1", 0)
    processes = Processes(tmp)
    try:
        start_clients(processes, SPEAKERS, server.url, mosquitto_url, topic_root, 24)
        yield service, server.url
    finally:
        processes.stop_all()
        server.stop()
        service.stop()


def _texts(driver, selector):
    """The text of every element the selector finds, read at once (the page redraws as it polls)."""
    script = "return [...document.querySelectorAll(arguments[0])].map((e) => e.textContent)"
    return driver.execute_script(script, selector)


def _classes(driver, selector):
    """The class attribute of every element the selector finds."""
    script = "return [...document.querySelectorAll(arguments[0])].map((e) => e.getAttribute('class'))"
    return driver.execute_script(script, selector)


def _finished(service):
    wait_for(service.orchestrator.finished.is_set, 240, f"{ROUNDS} rounds")
    wait_for(lambda: service.orchestrator.settled_round == ROUNDS, 60, "the last round's evaluation")


@pytest.mark.skipif(
    not shutil.which("chromium"), reason="needs Chromium: apt-get install chromium chromium-driver"
)
def test_the_dashboard_shows_the_live_fleet_as_the_api_does(fleet, tmp_path):
    service, url = fleet
    driver = chromium(1400, 1500)  # tall enough for the screenshot to show the charts and rounds
    try:
        driver.get(url + "/")  # opened while the fleet starts: the page follows it by polling
        _finished(service)
        wait_for(lambda: shown_round(driver) == ROUNDS, 30, "the page to show the last round")
        status, rounds = get_json(url + "/api/status"), get_json(url + "/api/rounds")
        devices = {
            row.get_attribute("data-device"): row
            for row in driver.find_elements("css selector", "#devices tbody tr")
        }
        assert sorted(devices) == sorted(SPEAKERS) == sorted(status["devices_online"])
        for row in devices.values():
            assert row.find_element("css selector", ".state").text.startswith("online")
        latest = driver.find_element("css selector", f'#rounds tr[data-round="{status["completed_round"]}"]')
        assert latest.find_element("css selector", ".accuracy").text == f"{rounds[-1]['accuracy']:.4f}"
        summary = driver.find_element("id", "summary").text
        assert f"round {ROUNDS} of {ROUNDS}" in summary and "3 of 3 devices online" in summary
        link = driver.find_element("id", "model-download").get_attribute("href")
        assert link.endswith(f"/api/models/{ROUNDS}/onnx")
        assert driver.find_elements("css selector", "#accuracy-chart polyline"), "the accuracy curve is drawn"
        last = rounds[-1]
        federated, central = last["federated_accuracy"], last["accuracy"]
        figures = (
            f"Accuracy of round {ROUNDS}'s model: {federated:.4f} federated, on held-out clips of the "
            f"devices' own speakers ({last['evaluation_reports']} devices, {last['evaluation_clips']} clips);"
            f" {central:.4f} central, on the coordinator's held-out set."
        )
        wait_for(lambda: _texts(driver, "#accuracy-now") == [figures], 15, "the last round's figures")
        assert "speakers it has never heard" in _texts(driver, "#accuracy-note")[0]
        for chart in ("#accuracy-chart", "#loss-chart"):
            assert _texts(driver, f"{chart} text.tick.x") == [str(r) for r in range(ROUNDS + 1)]
            assert len(_texts(driver, f"{chart} text.tick.y")) >= 3 and _texts(driver, f"{chart} line.grid")
            assert _texts(driver, f"{chart} .axis-title.x") == ["round"]
            legend = [c.split()[1] for c in _classes(driver, f"{chart.replace('chart', 'legend')} .key")]
            assert legend == _classes(driver, f"{chart} polyline") == ["central", "federated"]
        assert _texts(driver, "#first-model") == [
            "Round 0 is the first model, before any device trained: random weights."
        ]
        assert _texts(driver, "#score-note")[0].startswith("Hardware score: how fast a device trains")
        overview = get_json(url + "/api/overview")
        listed = {d["device_id"]: d["missing_labels"] for d in overview["devices"]}
        assert all(labels is not None for labels in listed.values()), "every device sent its counts"
        missing = dict(
            zip(_texts(driver, "#devices .device-id"), _texts(driver, "#devices .missing"), strict=True)
        )
        assert missing == {d: ", ".join(labels) or "none" for d, labels in listed.items()}
        assert _texts(driver, "#devices .last-error") == ["none"] * len(SPEAKERS)
        assert _texts(driver, "#rounds td:first-child")[-1] == "0 (first model)", "every round, oldest last"
        out = Path(SCREENSHOT_DIR) if SCREENSHOT_DIR else tmp_path
        assert driver.save_screenshot(str(out / "dashboard.png"))
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"], "no script errors"
    finally:
        driver.quit()


def test_metrics_count_what_the_stored_rounds_hold(fleet):
    service, url = fleet
    _finished(service)
    text = subprocess.run(
        ["curl", "-sf", url + "/metrics"], capture_output=True, text=True, check=True
    ).stdout
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    stored = service.store.rounds()[1:]
    assert samples[("fedspeech_rounds_completed_total", ())] == len(stored) == ROUNDS
    assert samples[("fedspeech_round_duration_seconds_count", ())] == ROUNDS
    assert samples[("fedspeech_round_duration_seconds_sum", ())] == pytest.approx(
        sum(r.wall_s for r in stored)
    )
    assert samples[("fedspeech_updates_accepted_total", ())] == sum(
        len(service.store.updates(r.round)) for r in stored
    )
    assert samples[("fedspeech_bytes_total", (("direction", "up"),))] == sum(r.bytes_up for r in stored) > 0
    assert (
        samples[("fedspeech_bytes_total", (("direction", "down"),))] == sum(r.bytes_down for r in stored) > 0
    )
    assert samples[("fedspeech_devices_online", ())] == len(SPEAKERS)
    assert samples[("fedspeech_accuracy", (("evaluation", "central"),))] == pytest.approx(stored[-1].accuracy)
    assert samples[("fedspeech_loss", (("evaluation", "federated"),))] == pytest.approx(
        stored[-1].federated_loss
    )


def test_status_prints_a_row_per_device(fleet):
    service, url = fleet
    _finished(service)
    done = subprocess.run(
        [sys.executable, "-m", "fedspeech", "status", "--coordinator", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"round {ROUNDS} of {ROUNDS}" in lines[0] and "3 of 3 devices online" in lines[0]
    for speaker in SPEAKERS:
        row = next(line for line in lines if line.startswith(speaker + " "))
        assert row.split()[1] in ("online", "training", "evaluating"), row
        assert f"round {ROUNDS}: accepted" in row
    header = next(i for i, line in enumerate(lines) if line.startswith("ROUND "))
    assert lines[header + 1].split()[0] == str(ROUNDS), "newest round first"


@needs_chromium
def test_markup_a_device_sends_is_shown_as_text_never_run(fleet):
    """A refusal's reason can quote what a device sent (the task id of its upload): shown as text."""
    service, url = fleet
    _finished(service)
    registration = Registration("intruder", 5, Profile(cpu_count=1, cpu_freq_mhz=1.0, ram_available_mb=1.0))
    request = urllib.request.Request(url + "/api/devices", data=messages.encode(registration), method="POST")
    urllib.request.urlopen(request, timeout=10).close()
    payload = '<img src=x onerror="document.title=1">'
    service.outcomes.rejected("intruder", ROUNDS + 1, "not_wanted", f"no open task {payload!r} for intruder")
    driver = chromium()
    try:
        driver.get(url + "/")
        rows = lambda: driver.find_elements("css selector", 'tr[data-device="intruder"]')  # noqa: E731
        row = wait_for(rows, 15, "the intruder's row")[0]
        assert payload in row.text, "shown as the text it is"
        assert not row.find_elements("css selector", "img") and driver.title == "fedspeech coordinator"
    finally:
        driver.quit()
