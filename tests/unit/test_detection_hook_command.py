"""The detection hook's checks and environment, without running a command: a command line split as a shell
would, a command that cannot run refused in one line, and values that any environment can hold.
"""

import sys

import pytest

from fedspeech.runtime.detection_hook import (
    MAX_VALUE_CHARS,
    DetectionHook,
    check_command,
    environment,
    split_command,
)
from fedspeech.runtime.streaming import Detection


def test_a_command_line_is_split_as_a_shell_would_without_running_one():
    assert split_command("notify-send 'a word' \"$HOME\" ; x") == ["notify-send", "a word", "$HOME", ";", "x"]
    for text in ["", "   ", "'unbalanced"]:
        with pytest.raises(ValueError, match="the detection hook's command"):
            split_command(text)


def test_a_command_is_a_name_on_path_or_an_executable_file(tmp_path):
    check_command(["sh", "-c", "true"])
    check_command([sys.executable])
    for command, problem in [
        ([], "empty"),
        (["fedspeech-no-such-command"], "not found on PATH"),
        ([str(tmp_path / "missing")], "is no file"),
        ([str(tmp_path)], "is no file"),
    ]:
        with pytest.raises(ValueError, match=problem):
            check_command(command)
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")
    with pytest.raises(ValueError, match="not executable"):
        check_command([str(plain)])


@pytest.mark.parametrize("options", [{"timeout_s": 0}, {"timeout_s": -1.0}, {"queue_size": 0}])
def test_settings_that_cannot_work_are_refused(options):
    with pytest.raises(ValueError, match="the detection hook's"):
        DetectionHook([sys.executable], **options)


def test_the_environment_holds_the_detection_and_only_values_an_environment_can_hold():
    values = environment(Detection("yes", 0.98765, 3.14159, 12), "yes please")
    assert set(values) == {
        "FEDSPEECH_LABEL",
        "FEDSPEECH_SPOKEN",
        "FEDSPEECH_CONFIDENCE",
        "FEDSPEECH_TIME",
        "FEDSPEECH_WALL_TIME",
        "FEDSPEECH_ROUND",
    }
    assert values["FEDSPEECH_CONFIDENCE"] == "0.9877" and values["FEDSPEECH_TIME"] == "3.142"
    assert values["FEDSPEECH_ROUND"] == "12" and values["FEDSPEECH_WALL_TIME"].endswith("+00:00")
    odd = environment(Detection("no", 0.5, 0.0), "\0nul\udcff\ud800" + "é" * 2 * MAX_VALUE_CHARS)
    assert odd["FEDSPEECH_SPOKEN"] == ("nul??" + "é" * MAX_VALUE_CHARS)[:MAX_VALUE_CHARS]
    assert odd["FEDSPEECH_ROUND"] == ""
    for value in odd.values():
        value.encode("utf-8")  # no surrogate left to fail the command's start
