"""`fedspeech strategies` and the README's table of settings come from the strategies' own declarations."""

import dataclasses
import subprocess
import sys
from pathlib import Path

from fedspeech.coordinator.strategies import STRATEGIES, strategy_class
from fedspeech.coordinator.strategies.catalogue import listing, settings_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readmes_table_of_settings_is_the_declarations():
    assert settings_table() in README.read_text(), (
        "a strategy's settings changed: fedspeech strategies --markdown"
    )


def test_every_strategy_and_setting_is_listed_with_its_default_and_bounds():
    text = listing()
    for name in STRATEGIES:
        assert f"\n{name}: " in f"\n{text}"
        for field in dataclasses.fields(strategy_class(name).Params):
            assert f"    {field.name}=" in text
    assert "    f=1 (0 to 1000): Byzantine devices tolerated" in text
    assert "    dp_delta=1e-05 (1e-12 to 0.09)" in text, "differential privacy's, as their options say"


def test_the_command_prints_them():
    run = subprocess.run(
        [sys.executable, "-m", "fedspeech", "strategies", "--markdown"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and run.stdout == settings_table(), run.stderr
