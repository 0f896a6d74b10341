"""The HTTP API described as an OpenAPI 3.1 document at `/api/openapi.json`, open to anyone.

Built when the app is made: its paths, methods and path parameters from the app's url_map, its bodies'
schemas from the dataclasses the code encodes (pydantic writes their JSON Schema). What a rule and a
dataclass cannot say is in OPERATIONS, one entry per endpoint: who may call it, what it answers and with
which refusals. tests/system/test_api_schema.py checks the live coordinator against the document.
"""

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired

from flask import Blueprint, Flask, Response, current_app, jsonify
from pydantic import ConfigDict, TypeAdapter
from typing_extensions import TypedDict  # pydantic takes typing's TypedDict only from Python 3.12 on
from werkzeug.routing import AnyConverter, BaseConverter, IntegerConverter, Rule

from fedspeech.coordinator.http.overview import Overview
from fedspeech.coordinator.round.acknowledgements import DeviceError
from fedspeech.coordinator.state.records import DeviceRecord, RoundRecord
from fedspeech.protocol import messages, routes
from fedspeech.protocol.messages import Credentials, EvaluationReport, Registration, TaskFailure, TaskInfo

bp = Blueprint("openapi", __name__, url_prefix=routes.PREFIX)
APP_KEY = "fedspeech.openapi"  # the document in app.extensions

JSON, BINARY, TEXT, HTML = "application/json", "application/octet-stream", "text/plain", "text/html"
_REF = "#/components/schemas/{model}"
_CLOSED = ConfigDict(extra="forbid")  # a reply that grows a key the document lacks fails the schema test


# The replies api.py builds inline rather than from a dataclass.
class Refusal(TypedDict):
    """Every refusal's body: why; revoked only to whoever presents the token of a revoked device."""

    __pydantic_config__ = _CLOSED  # type: ignore[misc]
    error: str
    revoked: NotRequired[bool]


class PublicKey(TypedDict):
    """The key tasks and model announcements are signed with, in base64."""

    __pydantic_config__ = _CLOSED  # type: ignore[misc]
    coordinator_key: str


class Received(TypedDict):
    """An upload taken: an update, an evaluation (both with their round) or shared validation clips."""

    __pydantic_config__ = _CLOSED  # type: ignore[misc]
    accepted: bool | int  # shared validation: how many clips
    device_id: str
    round: NotRequired[int]


class SecureSumTaken(TypedDict):
    """A secure-sum message taken."""

    __pydantic_config__ = _CLOSED  # type: ignore[misc]
    accepted: bool


class SecureSumWaiting(TypedDict):
    """A secure-sum phase still open: ask again."""

    __pydantic_config__ = _CLOSED  # type: ignore[misc]
    waiting: str


class Acknowledged(TypedDict):
    """A task taken."""

    __pydantic_config__ = _CLOSED  # type: ignore[misc]
    acknowledged: bool
    device_id: str


class Reported(TypedDict):
    """A failure report taken."""

    __pydantic_config__ = _CLOSED  # type: ignore[misc]
    reported: bool
    device_id: str


class Revoked(TypedDict):
    """A device revoked."""

    __pydantic_config__ = _CLOSED  # type: ignore[misc]
    revoked: str


class FederatedScore(TypedDict):
    """The latest round's federated accuracy, with the devices and test clips it rests on."""

    __pydantic_config__ = _CLOSED  # type: ignore[misc]
    accuracy: float
    devices: int | None
    clips: int | None


class Status(TypedDict):
    """What the coordinator is doing now; the keys marked NotRequired only for the admin token.

    Not closed: pydantic 2.14 passes a closed config on to the DeviceError dataclass inside, whose schema
    then differs from the one the overview holds.
    """

    completed_round: int | None
    federated: FederatedScore | None
    open_round: int | None
    target_rounds: int
    finished: bool
    devices_online: NotRequired[list[str]]
    broker: NotRequired[str]
    device_errors: NotRequired[dict[str, DeviceError]]
    waiting: NotRequired[str | None]


class DeviceState(TypedDict):
    """What GET /api/devices adds to each device's record: its latest MQTT status."""

    state: str
    train_counts: dict[str, int]
    test_counts: dict[str, int]
    shared_id: bool  # two devices registered with this id lately, each taking the other's token


class RoundUpdates(TypedDict):
    """What GET /api/rounds/{round} adds to the round's record."""

    updates: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]


@dataclass(frozen=True)
class Content:
    """A body: its media type and, for JSON, the types whose schemas it meets (none: any JSON value)."""

    media: str
    of: tuple[Any, ...] = ()
    message: bool = False  # a wire message: its one type's fields, and the kind and version encode adds
    many: bool = False  # a list of such values


Access = Literal["open", "device", "admin", "device or admin", "open, or a device"]


@dataclass(frozen=True)
class Operation:
    """What an endpoint takes and answers beyond what its rule says; refusals answer with a Refusal."""

    replies: Mapping[int, Content]
    access: Access = "open"
    body: Content | None = None
    refusals: tuple[int, ...] = ()
    headers: tuple[str, ...] = ()  # request headers it reads, beside Authorization


def _json(*of: Any, many: bool = False) -> Content:
    return Content(JSON, of, many=many)


def _message(message_type: type) -> Content:
    return Content(JSON, (message_type,), message=True)


ANY_BYTES = Content(BINARY)
# what admin.refusal answers, and the refusals of a device's token
_ADMIN, _DEVICE = (401, 429), (401,)

# endpoint -> its description; a route without one fails tests/unit/test_openapi.py
OPERATIONS: dict[str, Operation] = {
    "api.register": Operation(
        {200: _message(Credentials)}, body=_message(Registration), refusals=(400, 401, 403)
    ),
    "api.key": Operation({200: _json(PublicKey)}),
    "api.task": Operation({200: _message(TaskInfo)}),
    "api.model_file": Operation({200: ANY_BYTES}, "open, or a device", refusals=(404,)),
    "api.relayed_update": Operation({200: ANY_BYTES}, "device", refusals=(*_DEVICE, 404, 409)),
    "api.announcement": Operation({200: _json()}, refusals=(404,)),
    "api.latest_model": Operation({200: _json(RoundRecord)}, "admin", refusals=(*_ADMIN, 404)),
    "api.upload_update": Operation(
        {200: _json(Received)},
        "device",
        body=ANY_BYTES,
        refusals=(400, *_DEVICE, 409),
        headers=("X-Content-SHA256",),
    ),
    "api.secure_sum_message": Operation(
        {200: _json(SecureSumTaken)}, "device", body=ANY_BYTES, refusals=(400, *_DEVICE, 409)
    ),
    "api.secure_sum_outcome": Operation(
        {200: _json(), 202: _json(SecureSumWaiting)}, "device", refusals=(*_DEVICE, 409)
    ),
    "api.acknowledge": Operation({200: _json(Acknowledged)}, "device", refusals=(*_DEVICE, 409)),
    "api.report_failure": Operation(
        {200: _json(Reported)}, "device", body=_message(TaskFailure), refusals=(400, *_DEVICE, 409)
    ),
    "api.upload_evaluation": Operation(
        {200: _json(Received)},
        "device",
        body=_message(EvaluationReport),
        refusals=(400, *_DEVICE, 409),
    ),
    "api.share_validation": Operation(
        {200: _json(Received)}, "device", body=ANY_BYTES, refusals=(400, *_DEVICE, 409)
    ),
    "api.status": Operation({200: _json(Status)}),
    "api.devices": Operation({200: _json(DeviceRecord, DeviceState, many=True)}, "admin", refusals=_ADMIN),
    "api.rounds": Operation({200: _json(RoundRecord, many=True)}, "admin", refusals=_ADMIN),
    "api.round_detail": Operation({200: _json(RoundRecord, RoundUpdates)}, "admin", refusals=(*_ADMIN, 404)),
    "api.device_record": Operation({200: _json(DeviceRecord)}, "device or admin", refusals=(*_ADMIN, 404)),
    "api.revoke": Operation({200: _json(Revoked)}, "admin", refusals=(*_ADMIN, 403, 404)),
    "openapi.document": Operation({200: _json()}),
    "dashboard.page": Operation({200: Content(HTML)}, "admin", refusals=_ADMIN),
    "dashboard.overview_json": Operation({200: _json(Overview)}, "admin", refusals=_ADMIN),
    "dashboard.static": Operation(
        {200: ANY_BYTES, 404: Content(HTML)}, "admin", refusals=_ADMIN
    ),  # Flask's 404
    "metrics.metrics": Operation({200: Content(TEXT)}, "admin", refusals=_ADMIN),
}

# what the HTTP server itself answers before the app sees a request (request_reading): too slow, too busy
SERVER_REFUSALS = (408, 503)
_SECURITY: dict[str, list[dict[str, list[str]]]] = {
    "open": [],
    "device": [{"deviceToken": []}],
    "admin": [{"adminToken": []}],
    "device or admin": [{"deviceToken": []}, {"adminToken": []}],
    "open, or a device": [{}, {"deviceToken": []}],  # a device's download counts as its round's traffic
}


@bp.get(routes.OPENAPI_RULE)
def document() -> Response:
    """This API described, as OpenAPI 3.1: open to anyone, as it says nothing of the fleet or its devices."""
    return jsonify(current_app.extensions[APP_KEY])


def describe(app: Flask) -> dict[str, Any]:
    """The OpenAPI document of every route of app; KeyError naming an endpoint OPERATIONS lacks."""
    schemas = _Schemas()
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        operation = OPERATIONS[rule.endpoint]
        view = app.view_functions[rule.endpoint]
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            paths.setdefault(_template(rule), {})[method.lower()] = _operation(
                rule, method, operation, (view.__doc__ or "").strip(), schemas
            )
    return {
        "openapi": "3.1.0",
        "info": {"title": "fedspeech coordinator", "version": str(messages.SCHEMA_VERSION)},
        "paths": paths,
        "components": {
            "schemas": schemas.definitions,
            "securitySchemes": {
                "deviceToken": {"type": "http", "scheme": "bearer", "description": "a device's token"},
                "adminToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the operator's admin token (also as the password of Basic)",
                },
            },
        },
    }


def _template(rule: Rule) -> str:
    """The rule's path in OpenAPI's form: /api/models/{round}/{kind}."""
    return re.sub(r"<(?:[^<>:]+:)?(\w+)>", r"{\1}", rule.rule)


def _operation(
    rule: Rule, method: str, operation: Operation, doc: str, schemas: "_Schemas"
) -> dict[str, Any]:
    """One method of one rule, as OpenAPI's Operation Object."""
    summary, _, description = doc.partition("\n\n")
    converters = rule._converters  # what each path value must match: werkzeug has no public name for them
    refusals = {*operation.refusals, *SERVER_REFUSALS}
    refusals |= {413} if operation.body else set()
    refusals |= {404} if converters else set()  # a path whose values no converter takes matches no route
    responses: dict[str, Any] = {
        str(status): {"description": "a reply", "content": {content.media: schemas.media(content)}}
        for status, content in operation.replies.items()
    }
    for status in sorted(refusals - set(operation.replies)):
        responses[str(status)] = {"description": "refused", "content": {JSON: schemas.media(_json(Refusal))}}
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": _parameter(converter)}
        for name, converter in converters.items()
    ]
    parameters += [{"name": name, "in": "header", "schema": {"type": "string"}} for name in operation.headers]
    described: dict[str, Any] = {
        "operationId": f"{rule.endpoint}.{method.lower()}",
        "summary": " ".join(summary.split()),
        "security": _SECURITY[operation.access],
        "parameters": parameters,
        "responses": responses,
    }
    if description.strip():
        described["description"] = description.strip()
    if operation.body is not None:
        content = {operation.body.media: schemas.media(operation.body)}
        described["requestBody"] = {"required": True, "content": content}
    return described


def _parameter(converter: BaseConverter) -> dict[str, Any]:
    """The JSON Schema of the values a path converter matches."""
    if isinstance(converter, IntegerConverter):
        return {"type": "integer", "minimum": 0}  # Flask's int matches digits only: no sign
    if isinstance(converter, AnyConverter):
        return {"type": "string", "enum": sorted(converter.items)}
    return {"type": "string", "pattern": f"^{converter.regex}$"}


class _Schemas:
    """The JSON Schemas of the document's bodies, made by pydantic, and the definitions they share."""

    def __init__(self) -> None:
        self.definitions: dict[str, Any] = {}

    def media(self, content: Content) -> dict[str, Any]:
        """The Media Type Object of a body."""
        if content.media != JSON:
            return {}
        parts = [self._schema(of) for of in content.of]
        if content.message:
            parts.append(_envelope(content.of[0]))
        schema = parts[0] if len(parts) == 1 else {"allOf": parts} if parts else {}
        return {"schema": {"type": "array", "items": schema} if content.many else schema}

    def _schema(self, of: Any) -> dict[str, Any]:
        """A reference to a type's schema, kept with the definitions it refers to in the components."""
        schema = dict(_json_schema(of))
        for name, definition in [*schema.pop("$defs", {}).items(), (of.__name__, schema)]:
            if self.definitions.setdefault(name, definition) != definition:
                raise ValueError(f"two types named {name} in the API: the document needs one")
        return {"$ref": _REF.format(model=of.__name__)}


@functools.cache  # the same for every app a process makes: pydantic takes a while over each type
def _json_schema(of: Any) -> dict[str, Any]:
    """A type's JSON Schema, its references into the document's components."""
    return TypeAdapter(of).json_schema(ref_template=_REF)


def _envelope(message_type: type) -> dict[str, Any]:
    """The keys messages.encode adds to a message's fields: its schema version and kind."""
    kind = messages._KINDS[message_type]  # the wire name of each message type, defined there only
    return {
        "type": "object",
        "properties": {"v": {"const": messages.SCHEMA_VERSION}, "kind": {"const": kind}},
        "required": ["v", "kind"],
    }
