"""The extras a command needs: the modules fedspeech looks for match pyproject.toml's, and a missing one is
named in one line with the pip command that installs it.
"""

import re
import tomllib
from pathlib import Path

import pytest

from fedspeech import installed_commands
from fedspeech.installed_commands import EXTRAS, extra_of, require_extra

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# distributions imported under another name
IMPORT_NAMES = {"prometheus-client": "prometheus_client", "dp-accounting": "dp_accounting"}


def _declared(extras: dict[str, list[str]], extra: str) -> set[str]:
    """The import names of an extra's requirements, with the extras of fedspeech it names expanded."""
    names = set()
    for requirement in extras[extra]:
        name, nested = re.match(r"([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", requirement).groups()
        if name == "fedspeech":
            names |= {n for inner in nested.split(",") for n in _declared(extras, inner.strip())}
        else:
            names.add(IMPORT_NAMES.get(name, name))
    return names


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_the_modules_of_each_extra_are_pyprojects(extra):
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS[extra]) == _declared(extras, extra)


def test_a_missing_module_is_named_with_the_extra_that_installs_it(monkeypatch):
    found = {"torch", "onnx"}  # onnxscript missing, as in a venv where it failed to install
    monkeypatch.setattr(
        installed_commands.importlib.util, "find_spec", lambda name: object() if name in found else None
    )
    with pytest.raises(SystemExit) as stopped:
        require_extra("client")
    assert str(stopped.value) == (
        'fedspeech client: needs onnxscript, which the train extra installs: pip install "fedspeech[train]"'
    )
    found.add("onnxscript")
    require_extra("client")  # all there: no word


def test_the_extra_of_a_module_is_the_commands_else_the_smallest_that_installs_it():
    assert extra_of("torch.nn", "coordinator") == "coordinator"
    assert extra_of("torch.nn", "client") == extra_of("torch", "bench") == "train"
    assert extra_of("flask") == "coordinator"
    assert extra_of("sounddevice", "listen") == "audio"
    assert extra_of("numpy", "client") is None and extra_of(None) is None
