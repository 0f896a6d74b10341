"""The round loop in a fresh interpreter: it imports neither torch nor the broker's or the web's libraries."""

import subprocess
import sys


def test_the_round_loop_needs_no_torch_broker_or_web_framework():
    code = (
        "import sys; import fedspeech.coordinator.orchestrator, fedspeech.coordinator.strategies; "
        "print(sorted(m for m in ('torch', 'paho', 'flask', 'onnx') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
