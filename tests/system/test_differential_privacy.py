"""DP-FedAvg with real device processes over Mosquitto: epsilon after each round is the accountant's, in
/api/rounds, in /metrics and on the dashboard in headless Chromium, and training stops at the budget with
the last model still published.
"""

import shutil
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedspeech_bench.dashboard_polling import chromium
from tests.helpers.coordinators import running_coordinator
from tests.helpers.devices import start_clients
from tests.helpers.waiting import get_json, wait_for
from tests.unit.test_privacy_budget import independently

SPEAKERS = ["jackson", "nicolas", "theo"]
pytestmark = pytest.mark.xdist_group("chromium")  # one headless browser at a time on this machine


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Chromium: apt-get install chromium")
def test_epsilon_is_shown_everywhere_and_training_stops_at_the_budget(
    tmp_path, mosquitto_url, topic_root, processes
):
    budget = (independently(1.5, 1.0, 2, 1e-5) + independently(1.5, 1.0, 3, 1e-5)) / 2  # two rounds
    config = {
        "broker": mosquitto_url,
        "topic_root": topic_root,
        "rounds": 6,
        "min_devices": 3,
        "min_results": 2,
        "eval_every": 0,
        "dp_noise_multiplier": 1.5,
        "dp_norm_bound": 2.0,
        "dp_epsilon": budget,
    }
    with running_coordinator(tmp_path, **config) as (service, url):
        clients = start_clients(processes, SPEAKERS, url, mosquitto_url, topic_root, max_samples=24)
        wait_for(service.orchestrator.finished.is_set, 240, "training to stop at the budget")
        assert all(p.poll() is None for p in clients)
        rounds = get_json(f"{url}/api/rounds")
        assert [r["round"] for r in rounds] == [0, 1, 2], "no round past the budget"
        expected = independently(1.5, 1.0, 2, 1e-5)
        assert rounds[2]["dp_epsilon"] == pytest.approx(expected, rel=1e-9) and rounds[2]["dp_delta"] == 1e-5
        assert rounds[1]["dp_epsilon"] == pytest.approx(independently(1.5, 1.0, 1, 1e-5), rel=1e-9)
        assert get_json(f"{url}/api/status")["completed_round"] == 2, "the last model stays published"
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
            families = {f.name: f for f in text_string_to_metric_families(reply.read().decode())}
        (sample,) = families["fedspeech_privacy_epsilon"].samples
        assert sample.value == pytest.approx(expected) and sample.labels == {"delta": "1e-05"}
        driver = chromium(1400, 1000)
        try:
            driver.get(url + "/")
            shown = f"epsilon {expected:.3g} at delta 1e-05"
            wait_for(
                lambda: shown in driver.find_element("id", "summary").text, 30, "the dashboard's epsilon"
            )
        finally:
            driver.quit()
