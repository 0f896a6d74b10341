"""Modules in a fresh interpreter: what they leave out of sys.modules (torch, broker and web libraries)."""

import json
import subprocess
import sys


def loaded(code: str, prefixes: tuple[str, ...]) -> list[str]:
    """Run CODE in a fresh interpreter; the modules it left loaded whose names start with one of PREFIXES."""
    names = f"sorted(m for m in sys.modules if m.startswith({prefixes!r}))"
    script = f"{code}\nimport json, sys\nprint(json.dumps({names}))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_round_loop_needs_no_torch_broker_or_web_framework():
    code = (
        "import sys; import fedspeech.coordinator.round.orchestrator, fedspeech.coordinator.strategies; "
        "print(sorted(m for m in ('torch', 'paho', 'flask', 'onnx') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_settings_are_checked_without_torch():
    code = (
        "import sys\n"
        "from fedspeech.edge_client.trainer import training_settings\n"
        "from fedspeech.models.objectives import terms_from_settings\n"
        "config = {'proximal_mu': 0.1, 'prior_weight': 1.0, 'class_prior': [0.5, 0.5], 'time_budget_s': 5}\n"
        "print([type(term).__name__ for term in terms_from_settings(config, 2)])\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["['ClassPrior', 'Proximal', 'TimeBudget']", "False"]


def test_hearing_voice_needs_no_torch():
    """Running Silero VAD (the ONNX model on resampled audio) loads onnxruntime and no torch."""
    code = (
        "import numpy as np\n"
        "from fedspeech.runtime.voice_activity import VoiceActivity\n"
        "voice = VoiceActivity(8000)\n"
        "for _ in range(10):\n"
        "    voice.push(np.zeros(80, np.float32))\n"
    )
    names = loaded(code, ("torch", "onnxruntime"))
    assert "onnxruntime" in names
    assert [name for name in names if name.startswith("torch")] == []


def test_recording_needs_neither_torch_nor_the_coordinator():
    assert loaded("import fedspeech.edge_client.recording", ("torch", "fedspeech.coordinator")) == []


def test_every_commands_options_load_no_heavy_library():
    # every fedspeech command, the benchmarks' included, builds this parser first: a test suite and a
    # fleet's scripts start it hundreds of times, and scipy.signal alone took 1.6 s of each start
    heavy = ("torch", "scipy", "flask", "matplotlib", "onnx", "onnxruntime", "hypercorn", "amqtt")
    assert loaded("from fedspeech.__main__ import build_parser; build_parser()", heavy) == []
