"""The HTTP API through Flask's test client: model files, rounds and status from the state directory."""

from pathlib import Path

import pytest
from flask import Response
from werkzeug.test import EnvironBuilder

from fedspeech.coordinator.app import create_app
from fedspeech.coordinator.http.api import BODY_RULES, MAX_FAILURE_BYTES
from fedspeech.coordinator.http.body_rules import DEFAULT_LIMIT, BodyRule, admit
from fedspeech.coordinator.state.records import RoundRecord
from fedspeech.protocol import messages, weights
from tests.helpers.configs import coordinator_config


@pytest.fixture
def app(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative state directory, as `fedspeech demo` uses by default
    config = coordinator_config(tmp_path, broker="mqtt://127.0.0.1:1883", eval_limit=10)
    return create_app(config.changed(state=Path("state")))


def test_serves_stored_models_and_rounds(app):
    store = app.extensions["fedspeech"].store
    blob = b"weights of round 0"
    record = RoundRecord(0, 1.0, 2.0, 1.0, 0, 0, 0.1, 0.1, 2.3, 0, 0, weights.sha256(blob), None)
    store.save_round(record, blob, b"onnx of round 0", [])
    http = app.test_client()

    reply = http.get("/api/models/0/weights")
    assert reply.status_code == 200 and reply.data == blob
    assert http.get("/api/models/0/onnx").data == b"onnx of round 0"
    missing = http.get("/api/models/5/weights")
    assert missing.status_code == 404 and "round 5" in missing.get_json()["error"]
    assert http.get("/api/models/0/pickle").status_code == 404
    assert http.get("/api/rounds").get_json()[0]["weights_sha256"] == weights.sha256(blob)
    assert http.get("/api/rounds/0").get_json()["updates"] == []
    assert http.get("/api/rounds/1").status_code == 404
    status = http.get("/api/status").get_json()
    assert status["completed_round"] == 0 and status["open_round"] is None and not status["finished"]


def test_a_bodys_rule_is_checked_from_its_headers_alone(app):
    """What the HTTP server asks before it reads a body: the token and the task, not the body."""
    app.extensions["fedspeech"].store.register_device("kitchen", "k" * 43, 40, {})
    upload = {"REQUEST_METHOD": "POST", "PATH_INFO": "/api/rounds/1/updates", "CONTENT_LENGTH": "67108864"}
    for auth, status in ((None, 401), ("x" * 43, 401), ("k" * 43, 409)):  # 409: no round is open
        headers = {"HTTP_AUTHORIZATION": f"Bearer {auth}"} if auth else {}
        refused = admit(app, _environ(**upload, **headers), BODY_RULES)
        assert isinstance(refused, Response) and refused.status_code == status, auth
    failure = {"REQUEST_METHOD": "POST", "PATH_INFO": "/api/tasks/t1/failure", "CONTENT_LENGTH": "100000"}
    refused = admit(app, _environ(**failure), BODY_RULES)
    assert isinstance(refused, Response) and refused.status_code == 401, "a failure report needs a token"
    report = admit(app, _environ(**failure, HTTP_AUTHORIZATION=f"Bearer {'k' * 43}"), BODY_RULES)
    assert report == BodyRule(MAX_FAILURE_BYTES), "and is short"
    registration = admit(app, _environ(REQUEST_METHOD="POST", PATH_INFO="/api/devices"), BODY_RULES)
    assert registration == BodyRule(messages.MAX_MESSAGE_BYTES)
    nowhere = admit(app, _environ(REQUEST_METHOD="POST", PATH_INFO="/api/nowhere"), BODY_RULES)
    assert nowhere == BodyRule(DEFAULT_LIMIT), "the app answers a path it does not have, as ever"


def _environ(**values: str) -> dict:
    """A request's WSGI environment as the HTTP server has it before the body: headers, no body."""
    return {**EnvironBuilder().get_environ(), **values}
