"""The strategy interface is a short list of hooks, each serving more than one method, and the round loop
calls no other."""

import ast
import inspect
from pathlib import Path

from fedspeech.coordinator.round import orchestrator
from fedspeech.coordinator.strategies import Strategy

HOOKS = {
    "configure_round",
    "before_aggregate",
    "aggregate",
    "secure_terms",
    "after_aggregate",
    "restore",
    "privacy_after",
    "on_round_end",
}


def test_the_interface_is_these_hooks_and_no_more():
    methods = {
        name for name, _ in inspect.getmembers(Strategy, inspect.isfunction) if not name.startswith("_")
    }
    assert methods == HOOKS, "a hook added or taken away: say why in the strategy interface's docstring"


def test_the_round_loop_calls_only_hooks_on_the_strategy():
    tree = ast.parse(Path(inspect.getfile(orchestrator)).read_text())
    called = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "strategy"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "self"
    }
    declared = {"name", "needs", "mode", "personal"}  # what a strategy says of itself
    assert called - declared <= HOOKS, called - declared - HOOKS
    assert "stop_before" not in called and "clip_count" not in called
