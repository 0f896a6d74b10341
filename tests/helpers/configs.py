"""Coordinator configs for tests: the state in the test's folder, no broker port taken unless asked."""

from pathlib import Path
from typing import Any

from fedspeech.coordinator.config import CoordinatorConfig


def coordinator_config(tmp_path: Path, **settings: Any) -> CoordinatorConfig:
    """The defaults with the state under tmp_path and the embedded broker on port 0, then settings by name.

    Port 0 suits an app whose service is never started; a test that starts the embedded broker gives
    broker_port=free_port(), one that uses Mosquitto gives broker.
    """
    base = CoordinatorConfig().changed(state=tmp_path / "state", broker_port=0)
    return base.changed(**settings)
