"""`fedspeech bench latency` on a few words: every path hears them after they end; its table and plot."""

import json

import pytest

from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech_bench.detection_latency import run
from tests.helpers.ports import free_port

pytestmark = pytest.mark.timeout(180)


def test_each_path_hears_the_words_after_they_end(fsdd_model, mosquitto_url, tmp_path):
    table = run(fsdd_model.onnx_path, 4, 0, BrokerSettings(mosquitto_url), free_port(), tmp_path)
    results = {result["path"]: result for result in json.loads((tmp_path / "latency.json").read_text())}
    assert set(results) == {"in process", "Wyoming", "MQTT"}
    for result in results.values():
        assert result["words"] == 4 and result["heard"] >= 3, result
        assert all(0 < ms < 2000 for ms in result["latencies_ms"]), result  # decided once the word is over
        assert f"| {result['path']} | {result['heard']} of 4 |" in table
    assert (tmp_path / "latency.png").stat().st_size > 0
