"""The README's own words as commands: its first two lines, and every `fedspeech` command of "Your own
devices" as fedspeech's own parser reads it, so that a renamed option or a wrong value shows here.
"""

import argparse
import re
import shlex
from pathlib import Path

import pytest

from fedspeech.__main__ import build_parser
from tests.helpers.readme import README, own_devices_blocks, own_devices_section

ROOT = Path(__file__).resolve().parents[2]


def parsed(command: str) -> tuple[argparse.Namespace, list[str]]:
    """A README `fedspeech ...` command (its "..." left out) as fedspeech's parser reads it, and what it
    did not take.
    """
    return build_parser().parse_known_args([word for word in shlex.split(command)[1:] if word != "..."])


def own_devices_commands() -> list[str]:
    """Every `fedspeech ...` command of the section: its code blocks' lines and its inline code."""
    lines = [line for block in own_devices_blocks() for line in block if line.startswith("fedspeech ")]
    return lines + re.findall(r"`(fedspeech [^`]+)`", own_devices_section())


def test_the_readme_opens_with_the_two_commands_saying_which_is_which():
    block = README.split("```")[1].strip().splitlines()
    assert README.startswith("```") and len(block) == 2, (
        "the page opens with the two commands, nothing before"
    )
    setup, tests = ([part.strip() for part in line.split("#", 1)] for line in block)
    assert setup == [
        'pip install -e ".[all]" -e ./bench && fedspeech demo',
        "set everything up, run the demo",
    ]
    assert tests == ["tests/run", "run every test"]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert [line for line in ci if line.startswith(tests[0])], "CI runs the README's test command"


def test_every_fedspeech_command_of_the_own_devices_section_parses():
    commands = own_devices_commands()
    named = {shlex.split(command)[1] for command in commands}
    # the set-up, the few-takes recipe and a device's recording, training and listening are all read
    assert {"devices", "broker-config", "coordinator", "client", "record", "listen"} <= named, named
    for command in commands:
        if " --" not in command:
            continue  # a command named in passing ("after `fedspeech devices add`"), not given whole
        try:
            _, unknown = parsed(command)
        except SystemExit as exc:
            pytest.fail(f"README: `{command}`: {exc}")
        assert not unknown, f"README: `{command}` has options fedspeech does not take: {unknown}"


def test_the_few_takes_recipe_is_one_block_with_its_learning_rate_and_synthetic_takes():
    (recipe,) = [block for block in own_devices_blocks() if any("--mix-synthetic" in line for line in block)]
    coordinator, client = (parsed(line)[0] for line in recipe if line.startswith("fedspeech "))
    assert (coordinator.init, coordinator.lr) == ("synthetic", 1e-3)
    assert client.mix_synthetic == 10


def test_the_readme_says_how_to_use_another_broker_port_and_what_the_wheel_build_needs():
    said = " ".join(own_devices_section().split())
    assert "for another, give it `--port N` and the coordinator and devices `--broker mqtt://HOST:N`" in said
    port = build_parser().parse_args(["broker-config", "--port", "1884"])
    assert port.port == 1884
    assert "`pip install build && python -m build --wheel`" in said, "the build's prerequisite, first"
    assert "from a checkout without a `build/` folder" in said
