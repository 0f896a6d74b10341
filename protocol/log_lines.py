"""Log lines that values from the network cannot forge: control characters escaped in every message.

A URL path, an MQTT topic or a peer's error text may hold a newline; written as it is, it would start a
line of its own that reads like the process' own. The processes format every record with LogFormatter,
which escapes control and line-separator characters in the message and in an exception's text (the
stack lines around it come from the code, not the network), so a record is always one line of message.
"""

import logging
import re
import traceback
from types import TracebackType
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# C0 and C1 controls (newline, carriage return, escape, ...), DEL, and Unicode's line and paragraph separators
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def escape(text: str) -> str:
    """text with each control character written as its Python escape (a newline as \\n)."""
    return _CONTROL.sub(lambda match: repr(match[0])[1:-1], text)


class LogFormatter(logging.Formatter):
    """A Formatter whose messages and exception texts have their control characters escaped."""

    def format(self, record: logging.LogRecord) -> str:
        """The record's line, and its traceback if it has one."""
        cached = record.exc_text  # another handler's text of the exception, unescaped: written anew here
        if record.exc_info:
            record.exc_text = None
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 # logging's name
        """The record in the format, its message escaped."""
        record.message = escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: _ExcInfo) -> str:  # noqa: N802 # logging's name
        """The traceback as Python writes it, each exception's own text escaped."""
        exception = traceback.TracebackException(*ei)
        code = {chunk for e in _chain(exception) for chunk in e.stack.format()}
        lines = []
        for chunk in exception.format():
            # an exception's line starts with its type's name; the others are the code's and Python's own
            if chunk in code or chunk.startswith(("Traceback (most recent call last)", "\n")):
                lines.append(chunk)
            else:
                lines.append(escape(chunk.removesuffix("\n")) + "\n")
        return "".join(lines).removesuffix("\n")


def _chain(exception: traceback.TracebackException) -> list[traceback.TracebackException]:
    """The exception and those it was raised from or while handling."""
    chain, seen = [], set()
    current: traceback.TracebackException | None = exception
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def configure(level: int, stream: TextIO | None = None) -> logging.Handler:
    """Log records of level and above to stream (stderr by default), one escaped line each; the handler."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LogFormatter(FORMAT))
    root = logging.getLogger()
    root.setLevel(level)
    root.addHandler(handler)
    return handler
