"""Waiting for something a test started, and reading JSON from its HTTP API."""

import json
import time
import urllib.request
from collections.abc import Callable

import pytest


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.2):
    """Poll until predicate returns something truthy; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def get_json(url: str):
    """GET a JSON document, or None if the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())
    except OSError:
        return None
