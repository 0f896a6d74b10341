"""The OpenAPI document: valid, open, every route in it, its bodies' schemas made from their dataclasses."""

import dataclasses
import re
from typing import Any

import pytest
from openapi_spec_validator import validate

from fedspeech.coordinator.app import create_app
from fedspeech.coordinator.http.openapi import OPERATIONS, Content, describe
from fedspeech.protocol import routes
from fedspeech.protocol.messages import Registration
from tests.helpers.configs import coordinator_config

DOCUMENT = routes.PREFIX + routes.OPENAPI_RULE


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    folder = tmp_path_factory.mktemp("openapi")
    token_file = folder / "admin-token"
    token_file.write_text("an-admin-token-of-some-length-0123456789")
    token_file.chmod(0o600)
    config = coordinator_config(folder, broker="mqtt://127.0.0.1:1883", admin_token_file=token_file)
    return create_app(config)


@pytest.fixture(scope="module")
def document(app) -> dict[str, Any]:
    reply = app.test_client().get(DOCUMENT)  # no token: the document says nothing of the fleet
    assert reply.status_code == 200
    return reply.get_json()


def test_the_document_is_valid_openapi(document):
    validate(document)
    assert document["openapi"].startswith("3.1")


def test_every_route_and_method_is_described(app, document):
    rules = {
        (rule.rule, method.lower())
        for rule in app.url_map.iter_rules()
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    described = {
        (path.replace("{", "<").replace("}", ">"), method)
        for path, item in document["paths"].items()
        for method in item
    }
    assert {(_plain(rule), method) for rule, method in rules} == described
    assert set(OPERATIONS) == {rule.endpoint for rule in app.url_map.iter_rules()}  # none stale


def _plain(rule: str) -> str:
    """A Flask rule without its converters: /api/models/<round>/<kind>."""
    return re.sub(r"<(?:[^<>:]+:)?(\w+)>", r"<\1>", rule)


def test_a_route_without_a_description_is_refused(app, monkeypatch):
    monkeypatch.delitem(OPERATIONS, "api.key")
    with pytest.raises(KeyError, match="api.key"):
        describe(app)


def test_path_parameters_take_what_the_rules_take(document):
    model = document["paths"]["/api/models/{round}/{kind}"]["get"]["parameters"]
    schemas = {p["name"]: p["schema"] for p in model}
    assert schemas["round"] == {"type": "integer", "minimum": 0}
    assert set(schemas["kind"]["enum"]) == set(routes.MODEL_KINDS)


def test_a_message_body_is_its_dataclass_with_its_kind(document):
    body = document["paths"]["/api/devices"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    dataclass_part, envelope = body["allOf"]
    assert dataclass_part == {"$ref": "#/components/schemas/Registration"}
    assert envelope["properties"]["kind"] == {"const": "registration"}
    registration = document["components"]["schemas"]["Registration"]
    assert set(registration["properties"]) == {f.name for f in dataclasses.fields(Registration)}
    required = {
        f.name
        for f in dataclasses.fields(Registration)
        if f.default is f.default_factory is dataclasses.MISSING
    }
    assert set(registration["required"]) == required


def test_a_field_added_to_a_message_is_in_the_document(app, monkeypatch):
    grown = dataclasses.make_dataclass(
        "Registration",
        [("battery_percent", int, dataclasses.field(default=100))],
        bases=(Registration,),
        frozen=True,
    )
    grown.__module__ = Registration.__module__
    changed = dataclasses.replace(OPERATIONS["api.register"], body=Content("application/json", (grown,)))
    monkeypatch.setitem(OPERATIONS, "api.register", changed)
    registration = describe(app)["components"]["schemas"]["Registration"]
    assert "battery_percent" in registration["properties"] and "device_id" in registration["properties"]


def test_refusals_are_described_with_their_body(document):
    revoke = document["paths"]["/api/devices/{device_id}"]["delete"]
    assert {"200", "401", "403", "404", "429"} <= set(revoke["responses"])
    refusal = revoke["responses"]["404"]["content"]["application/json"]["schema"]
    assert refusal == {"$ref": "#/components/schemas/Refusal"}
    assert revoke["security"] == [{"adminToken": []}]
