"""Log lines that values from the network cannot forge: every record one line of message, escaped."""

import io
import logging
import re

import pytest

from fedspeech.protocol import log_lines

FORGED = "2026-01-01 00:00:00,000 WARNING fedspeech.coordinator.http.api: forged"
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")


@pytest.fixture
def logged():
    """The lines the processes' handler writes, for a logger of the test's own."""
    stream = io.StringIO()
    handler = log_lines.configure(logging.INFO, stream)
    try:
        yield logging.getLogger("fedspeech.test_log_lines"), stream
    finally:
        logging.getLogger().removeHandler(handler)


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("a\nb", "a\\nb"),
        ("a\r\nb", "a\\r\\nb"),
        ("\x1b[2Jcleared", "\\x1b[2Jcleared"),
        ("nul\x00", "nul\\x00"),
        ("tab\there", "tab\\there"),
        ("next line\x85", "next line\\x85"),
        ("line\u2028separator\u2029", "line\\u2028separator\\u2029"),
        ("del\x7f", "del\\x7f"),
        ("plain text, é and 数字 stay", "plain text, é and 数字 stay"),
    ],
)
def test_control_characters_are_escaped(text, escaped):
    assert log_lines.escape(text) == escaped


def test_a_value_with_a_newline_is_one_escaped_line(logged):
    log, stream = logged
    log.warning("GET %s rejected (401): %s", "/api/devices/x\n" + FORGED, {"id": "y\r\n" + FORGED})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and LINE.match(lines[0]), lines
    assert "/api/devices/x\\n2026-01-01" in lines[0] and "y\\r\\n2026" in lines[0]


def test_an_exception_text_cannot_forge_a_line_but_the_traceback_stays(logged):
    log, stream = logged
    try:
        try:
            raise KeyError("first\n" + FORGED)
        except KeyError as exc:
            raise ValueError("second\n" + FORGED) from exc
    except ValueError:
        log.exception("task %s failed", "t\n" + FORGED)
    lines = stream.getvalue().splitlines()
    assert not any(line.startswith(FORGED) for line in lines), lines
    assert sum(bool(LINE.match(line)) for line in lines) == 1
    assert "ValueError: second\\n2026-01-01" in lines[-1]
    assert any(line.startswith("KeyError: 'first\\n2026") for line in lines)
    assert lines.count("Traceback (most recent call last):") == 2
    assert any("direct cause of the following exception" in line for line in lines)
    assert any(line.startswith("  File ") for line in lines), "the stack is written as Python writes it"


@pytest.mark.parametrize("name", ["werkzeug", "waitress", "cheroot.error"])
def test_the_servers_and_libraries_records_go_through_it_too(logged, name):
    _, stream = logged
    logging.getLogger(name).warning('127.0.0.1 - - "GET /x%s HTTP/1.1" 404 -', "\n" + FORGED)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and LINE.match(lines[0]) and "/x\\n2026-01-01" in lines[0], lines
