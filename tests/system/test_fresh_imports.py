"""Modules in a fresh interpreter: what they leave out of sys.modules (torch, broker and web libraries)."""

import subprocess
import sys


def test_the_round_loop_needs_no_torch_broker_or_web_framework():
    code = (
        "import sys; import fedspeech.coordinator.orchestrator, fedspeech.coordinator.strategies; "
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
