"""`fedspeech bench inference` end to end on a trained model, with few repeats (timings are not asserted)."""

import json

from fedspeech.runtime.session import OnnxModel
from fedspeech_bench.inference import run_inference_bench, spec_of


def test_inference_bench_measures_every_engine_and_the_listener(fsdd_model, tmp_path):
    import subprocess
    import sys
    import time

    assert spec_of(OnnxModel(fsdd_model.onnx_path)) == fsdd_model.spec
    # the least a cold start does: start an interpreter, and load the model (timed here, warm)
    start = time.perf_counter()
    OnnxModel(fsdd_model.onnx_path)
    least_s = time.perf_counter() - start
    interpreter_s = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        interpreter_s.append(time.perf_counter() - start)
    least_s += min(interpreter_s)
    start = time.perf_counter()
    path = run_inference_bench(fsdd_model.onnx_path, tmp_path, repeats=30)
    whole_s = time.perf_counter() - start
    report = json.loads((tmp_path / "results.json").read_text())
    engines = {e["name"]: e for e in report["engines"]}
    assert set(engines) == {"onnx fp32", "onnx fp32 pair, one hop", "onnx int8", "torch eager"}
    pair = engines["onnx fp32 pair, one hop"]  # the same model as two graphs, the front-end on new frames
    assert pair["accuracy"] == engines["onnx fp32"]["accuracy"]
    assert all(e["median_ms"] > 0 and e["p95_ms"] >= e["median_ms"] for e in engines.values())
    assert engines["onnx fp32"]["accuracy"] == engines["torch eager"]["accuracy"] > 0.9
    assert engines["onnx int8"]["size_bytes"] < engines["onnx fp32"]["size_bytes"]
    assert report["mflop_per_window"] > 1 and report["floor_ms"] > 0
    # ten digits spoken by one held-out speaker, played in real time (accuracy is test_listen's business)
    assert 5 <= report["listen_detections"] <= 10
    assert 0 < report["listen_cpu_share"] < 1 and report["listen_peak_rss_mb"] > 10
    assert 0 < report["listen_steady_share"] < report["listen_cpu_share"]
    # to its first detection `fedspeech listen` starts, loads the model and hears a word: more than an
    # interpreter start and a model load, and a part of the whole run
    print(f"cold start {report['cold_start_s']:.2f} s, at least {least_s:.2f} s, run {whole_s:.1f} s")
    assert least_s < report["cold_start_s"] < whole_s
    assert "| onnx int8 |" in path.read_text()
