"""ONNX export, weight refresh, parity with torch, and the torch-free runtime."""

import copy
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from fedspeech.export.onnx_export import export_onnx, parity, update_onnx_weights
from fedspeech.export.onnx_weights import PREFIX
from fedspeech.export.quantize import quantize
from fedspeech.models import build_model
from fedspeech.models.clips.datasets import (
    client_clips,
    default_spec,
    load_corpus,
    load_waveforms,
    server_test_clips,
)
from fedspeech.models.norm import norm_names
from fedspeech.models.train import get_arrays, train_local
from fedspeech.protocol.messages import ModelSpec
from fedspeech.runtime.session import OnnxModel


@pytest.fixture(scope="module")
def fsdd():
    corpus = load_corpus("fsdd")
    spec = default_spec(corpus)
    train = load_waveforms(client_clips(corpus, "jackson")[0][::3], spec.sample_rate, spec.num_samples)
    test = load_waveforms(server_test_clips(corpus)[::6], spec.sample_rate, spec.num_samples)
    return corpus, spec, train, test


@pytest.fixture(scope="module")
def exported(fsdd, tmp_path_factory):
    corpus, spec, (waveforms, labels), _ = fsdd
    torch.manual_seed(0)
    model = build_model(spec)
    train_local(model, waveforms, labels, epochs=2, batch_size=32, learning_rate=2e-3)
    model.train()  # export must not leave the model in eval mode
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    path = export_onnx(model, spec, corpus.task.labels, path, round=3, task="fsdd")
    assert model.training
    return model, path


def test_parity_with_torch(fsdd, exported):
    _, _, _, (waveforms, _) = fsdd
    model, path = exported
    assert len(waveforms) == 50
    result = parity(model, path, waveforms)
    assert result.max_abs_diff < 1e-4
    assert result.agreement == 1.0


def test_metadata_and_file(fsdd, exported):
    corpus, _, _, _ = fsdd
    _, path = exported
    runtime = OnnxModel(path)
    assert runtime.labels == list(corpus.task.labels)
    assert (runtime.sample_rate, runtime.num_samples) == (8000, 8000)
    assert runtime.metadata["round"] == "3" and runtime.metadata["task"] == "fsdd"
    assert runtime.metadata["model"] == "cnn"
    assert json.loads(runtime.metadata["labels"]) == list(corpus.task.labels)
    assert os.listdir(path.parent) == ["model.onnx"]  # no temporary file left behind
    graph = onnx.load(path).graph
    assert [value.name for value in graph.input] == ["waveform"]
    assert graph.input[0].type.tensor_type.shape.dim[1].dim_value == 8000


def test_dynamic_batch_and_bytes(fsdd, exported):
    _, _, _, (waveforms, _) = fsdd
    _, path = exported
    runtime = OnnxModel(path.read_bytes())
    single = runtime.predict(waveforms[:1])
    batch = runtime.predict(waveforms[:7])
    assert single.shape == (1, 11) and batch.shape == (7, 11)
    np.testing.assert_allclose(batch.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(batch[:1], single, atol=1e-6)
    with pytest.raises(ValueError, match="8000"):
        runtime.predict(waveforms[:2, :4000])


def test_rejects_a_model_without_metadata(exported, tmp_path):
    _, path = exported
    proto = onnx.load(path)
    del proto.metadata_props[:]
    onnx.save(proto, tmp_path / "bare.onnx")
    with pytest.raises(ValueError, match="labels"):
        OnnxModel(tmp_path / "bare.onnx")


def test_update_weights_matches_fresh_export(fsdd, exported, tmp_path):
    corpus, spec, (waveforms, labels), (test_waveforms, _) = fsdd
    _, template = exported
    torch.manual_seed(1)
    other = build_model(spec)
    train_local(other, waveforms, labels, epochs=1, batch_size=32, learning_rate=2e-3, seed=7)
    fresh = export_onnx(other, spec, corpus.task.labels, tmp_path / "fresh.onnx", round=4, task="fsdd")
    updated = update_onnx_weights(template, get_arrays(other), tmp_path / "updated.onnx", round=4)
    expected = OnnxModel(fresh).predict(test_waveforms)
    assert not np.allclose(expected, OnnxModel(template).predict(test_waveforms), atol=1e-3)
    np.testing.assert_allclose(OnnxModel(updated).predict(test_waveforms), expected, atol=1e-6)
    assert OnnxModel(updated).metadata == OnnxModel(fresh).metadata
    assert parity(other, updated, test_waveforms).agreement == 1.0


def test_update_weights_rejects_mismatched_arrays(exported, tmp_path):
    model, template = exported
    arrays = get_arrays(model)
    arrays["head.weight"] = arrays["head.weight"][:5]
    with pytest.raises(ValueError, match="head.weight"):
        update_onnx_weights(template, arrays, tmp_path / "bad.onnx")
    with pytest.raises(ValueError, match="no initializers"):
        update_onnx_weights(template, {"extra.weight": np.zeros(3, np.float32)}, tmp_path / "bad.onnx")
    assert not (tmp_path / "bad.onnx").exists()


def test_runtime_never_imports_torch(exported):
    _, path = exported
    code = (
        "import sys, numpy as np\n"
        "import fedspeech.export\n"
        "from fedspeech.runtime.session import OnnxModel\n"
        f"model = OnnxModel({str(path)!r})\n"
        "assert model.predict(np.zeros((2, model.num_samples), np.float32)).shape == (2, 11)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def exported_bn(fsdd, tmp_path_factory):
    """A briefly trained cnn_bn, exported."""
    corpus, spec, (waveforms, labels), _ = fsdd
    spec = ModelSpec("cnn_bn", spec.sample_rate, spec.num_samples, spec.num_classes)
    torch.manual_seed(0)
    model = build_model(spec)
    train_local(model, waveforms, labels, epochs=1, batch_size=8, learning_rate=2e-3)
    folder = tmp_path_factory.mktemp("onnx-bn")
    path = export_onnx(model, spec, corpus.task.labels, folder / "model.onnx", round=1)
    return model, path


def test_cnn_bn_exports_with_parity_and_swappable_norm_tensors(fsdd, exported_bn):
    _, _, _, (waveforms, _) = fsdd
    model, path = exported_bn
    result = parity(model, path, waveforms)
    assert result.max_abs_diff < 1e-4 and result.agreement == 1.0
    names = norm_names(model)
    assert len(names) == 12
    initializers = {init.name: init for init in onnx.load(path).graph.initializer}
    arrays = get_arrays(model)
    for name in names:  # each BN tensor is its own initializer, not fused into a convolution
        assert PREFIX + name in initializers, name
        np.testing.assert_array_equal(numpy_helper.to_array(initializers[PREFIX + name]), arrays[name])
    assert OnnxModel(path).metadata["model"] == "cnn_bn"


def test_the_emotion_model_exports_with_parity_on_emodb_length_clips(tmp_path):
    spec = ModelSpec("emotion_cnn", 16000, 48000, 7)
    torch.manual_seed(0)
    model = build_model(spec)
    clips = np.random.default_rng(0).normal(0, 0.05, (24, spec.num_samples)).astype(np.float32)
    train_local(model, clips, np.arange(24) % 7, epochs=1, batch_size=8, learning_rate=2e-3)
    labels = ["anger", "boredom", "disgust", "fear", "happiness", "sadness", "neutral"]
    path = export_onnx(model, spec, labels, tmp_path / "model.onnx", round=1)
    result = parity(model, path, clips[:8] * np.linspace(0.2, 5, 8, dtype=np.float32)[:, None])
    assert result.max_abs_diff < 1e-4 and result.agreement == 1.0
    assert OnnxModel(path).metadata["model"] == "emotion_cnn"


def test_swapping_only_the_norm_tensors(fsdd, exported_bn, tmp_path):
    _, _, (train_waveforms, _), (waveforms, _) = fsdd
    model, template = exported_bn
    local = copy.deepcopy(model)  # FedBN: the device's own BN layers in the global model
    local.train()
    with torch.no_grad():
        local(torch.from_numpy(train_waveforms[:16] * 3.0))  # other batch statistics
        for name, parameter in local.named_parameters():
            if name in norm_names(local):
                parameter.add_(0.3)
    swapped = {name: value for name, value in get_arrays(local).items() if name in norm_names(local)}
    updated = update_onnx_weights(template, swapped, tmp_path / "local.onnx")
    assert not np.allclose(
        OnnxModel(updated).predict(waveforms), OnnxModel(template).predict(waveforms), atol=1e-3
    )
    result = parity(local, updated, waveforms)
    assert result.max_abs_diff < 1e-4 and result.agreement == 1.0


def test_weight_update_never_imports_torch(exported_bn, tmp_path):
    model, template = exported_bn
    bias = get_arrays(model)["features.1.1.bias"] + 1.0
    np.save(tmp_path / "bias.npy", bias)
    code = (
        "import sys, numpy as np\n"
        "from fedspeech.export.onnx_weights import update_onnx_weights\n"
        "template, bias, out = sys.argv[1:]\n"
        "update_onnx_weights(template, {'features.1.1.bias': np.load(bias)}, out)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    args = [str(template), str(tmp_path / "bias.npy"), str(tmp_path / "out.onnx")]
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    initializers = {init.name: init for init in onnx.load(tmp_path / "out.onnx").graph.initializer}
    np.testing.assert_array_equal(numpy_helper.to_array(initializers[PREFIX + "features.1.1.bias"]), bias)
    untouched = numpy_helper.to_array(initializers[PREFIX + "head.weight"])
    np.testing.assert_array_equal(untouched, get_arrays(model)["head.weight"])


def _accuracy(probabilities: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(probabilities.argmax(axis=1) == labels))


def test_parity_on_the_whole_heldout_set(fsdd_model):
    waveforms, labels = fsdd_model.heldout
    assert len(labels) == 300
    result = parity(fsdd_model.model, fsdd_model.onnx_path, waveforms)
    assert result.agreement >= 0.995 and result.max_abs_diff < 1e-3
    assert _accuracy(OnnxModel(fsdd_model.onnx_path).predict(waveforms), labels) > 0.9, (
        "a model worth quantising"
    )


@pytest.mark.parametrize("static", [True, False])
def test_int8_is_smaller_and_nearly_as_accurate(fsdd_model, static, tmp_path):
    waveforms, labels = fsdd_model.heldout
    int8 = quantize(fsdd_model.onnx_path, tmp_path / "int8.onnx", fsdd_model.calibration if static else None)
    fp32_size, int8_size = fsdd_model.onnx_path.stat().st_size, int8.stat().st_size
    fp32_acc = _accuracy(OnnxModel(fsdd_model.onnx_path).predict(waveforms), labels)
    runtime = OnnxModel(int8)
    int8_acc = _accuracy(runtime.predict(waveforms), labels)
    kind = "static" if static else "dynamic"
    print(f"{kind}: {int8_size / fp32_size:.3f}x size, accuracy {fp32_acc:.4f} -> {int8_acc:.4f}")
    assert int8_size <= 0.3 * fp32_size
    assert int8_acc >= fp32_acc - 0.01
    assert runtime.labels == fsdd_model.labels and runtime.metadata["quantization"] == "int8"


def test_static_int8_runs_integer_convolutions(fsdd_model, tmp_path):
    """onnxruntime fuses QDQ convolutions into QLinearConv on this CPU only with uint8 activations;
    with int8 ones it dequantises and runs float Conv, slower than the fp32 model."""
    import onnxruntime

    int8 = quantize(fsdd_model.onnx_path, tmp_path / "int8.onnx", fsdd_model.calibration)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    onnxruntime.InferenceSession(str(int8), options, providers=["CPUExecutionProvider"])
    ops = [node.op_type for node in onnx.load(tmp_path / "optimised.onnx").graph.node]
    fp32_ops = [node.op_type for node in onnx.load(fsdd_model.onnx_path).graph.node]
    trained_convs = fp32_ops.count("Conv") - 1
    assert ops.count("QLinearConv") == trained_convs  # all but the front end's DFT, which stays float


def test_quantize_needs_calibration_clips(fsdd_model, tmp_path):
    with pytest.raises(ValueError, match="calibration"):
        quantize(fsdd_model.onnx_path, tmp_path / "int8.onnx", np.zeros((0, 8000), np.float32))
