"""HTTP API blueprint, the devices' routes: registration, model downloads, update uploads, failure reports.

The operator's routes (status, devices, rounds, revocation) are added to the same blueprint by operator_api.
"""

import logging
from dataclasses import asdict
from typing import TYPE_CHECKING

from flask import Blueprint, Response, current_app, g, jsonify, request, send_file
from werkzeug.exceptions import ClientDisconnected, HTTPException, RequestEntityTooLarge

from fedspeech.coordinator.broker import broker_users
from fedspeech.coordinator.fleet.enrolment import EnrolmentRefused, revoked_reason
from fedspeech.coordinator.http.admin import admin_only
from fedspeech.coordinator.http.body_rules import BodyRule, Rules
from fedspeech.coordinator.privacy.secure_sum_uploads import Phase
from fedspeech.coordinator.refusals import BadUpload, NotWanted
from fedspeech.coordinator.state.store import StateWriteError
from fedspeech.protocol import messages, routes, signing, weights
from fedspeech.protocol.bounds import MAX_BLOB_BYTES, ProtocolError
from fedspeech.protocol.messages import Credentials, Registration, TaskFailure, TaskInfo

if TYPE_CHECKING:
    from fedspeech.coordinator.app import Service

log = logging.getLogger(__name__)
bp = Blueprint("api", __name__, url_prefix=routes.PREFIX)

MAX_UPDATE_BYTES = MAX_BLOB_BYTES
MAX_FAILURE_BYTES = 4096  # a failure report: its reason, JSON-escaped at worst, and the message's fields


def current_service() -> "Service":
    """The coordinator's service this request's app runs."""
    return current_app.extensions["fedspeech"]


def error(status: int, reason: str, revoked: bool = False) -> tuple[Response, int]:
    """A JSON refusal with its status, logged (409, routine, at INFO)."""
    # 409 is routine: an over-selected device's update arriving after its round took the first K
    level = logging.INFO if status == 409 else logging.WARNING
    log.log(level, "%s %s rejected (%d): %s", request.method, request.path, status, reason)
    # revoked: told only to whoever presents the token a device held when the operator revoked it
    return (jsonify(error=reason, revoked=True) if revoked else jsonify(error=reason)), status


class Unauthorized(Exception):
    """No bearer token, or one the coordinator never issued or no longer takes (revoked: by the operator)."""

    def __init__(self, reason: str, revoked: bool = False) -> None:
        super().__init__(reason)
        self.revoked = revoked


class _TooLarge(Exception):
    """A body over the size its route allows."""


_STATUSES = {BadUpload: 400, Unauthorized: 401, NotWanted: 409, _TooLarge: 413}
_KINDS = {
    BadUpload: "invalid",
    Unauthorized: "unauthorized",
    NotWanted: "not_wanted",
    _TooLarge: "too_large",
}


@bp.errorhandler(BadUpload)
@bp.errorhandler(NotWanted)
@bp.errorhandler(Unauthorized)
@bp.errorhandler(_TooLarge)
def _refused(exc: Exception) -> tuple[Response, int]:
    if request.endpoint == "api.upload_update":
        round = (request.view_args or {}).get("round", -1)
        current_service().outcomes.rejected(g.get("device_id"), round, _KINDS[type(exc)], str(exc))
    return error(_STATUSES[type(exc)], str(exc), getattr(exc, "revoked", False))


@bp.errorhandler(StateWriteError)
def _not_stored(exc: StateWriteError) -> tuple[Response, int]:
    log.error("%s", exc)
    return error(503, "the coordinator cannot store this now (its state folder takes no writes); try later")


@bp.app_errorhandler(HTTPException)
def _flask_refused(exc: HTTPException) -> HTTPException | tuple[Response, int]:
    # Flask's own refusals (no route matches the path, nor the method) come before any blueprint's: under
    # the API they are JSON as every other refusal there, elsewhere its pages
    if not request.path.startswith(routes.PREFIX + "/") or exc.code is None:
        return exc
    return error(exc.code, exc.name)


@bp.errorhandler(EnrolmentRefused)
def _enrolment_refused(exc: EnrolmentRefused) -> tuple[Response, int]:
    return error(exc.status, f"registration refused: {exc}", exc.revoked)


def _body(limit: int) -> bytes:
    """The request body, read no further than limit bytes (chunked bodies too); _TooLarge beyond."""
    # Werkzeug 3.1 cuts a chunked body at max_content_length without an error: one byte more than the
    # limit tells a body over it from a body at it.
    request.max_content_length = limit + 1
    try:
        body = request.get_data()
    except RequestEntityTooLarge:
        body = None
    except ClientDisconnected:
        body = b""
    if body is None or len(body) > limit:
        raise _TooLarge(f"body larger than {limit} bytes")
    if request.content_length is not None and len(body) < request.content_length:
        raise BadUpload("the body ended before its announced length")
    return body


def bearer() -> str | None:
    """The credential of an `Authorization: Bearer` header, or None."""
    auth = request.headers.get("Authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


def _device() -> str:
    """The device whose bearer token authorises this request: checked before the body is read."""
    token = bearer()
    if token is None:
        raise Unauthorized("missing bearer token")
    store = current_service().store
    device_id = store.device_for_token(token)
    if device_id is None:
        revoked = store.revoked_device(token)
        if revoked is not None:
            raise Unauthorized(revoked_reason(revoked), revoked=True)
        raise Unauthorized("unknown bearer token")
    g.device_id = device_id
    return device_id


def _message_rule(**_: object) -> BodyRule:
    """A message's body: at most MAX_MESSAGE_BYTES."""
    return BodyRule(messages.MAX_MESSAGE_BYTES)


def _device_message_rule(**_: object) -> BodyRule:
    """A device's message: only with its token."""
    _device()
    return _message_rule()


def _update_rule(round: int) -> BodyRule:
    """An update: only from a device with an open task, no larger than that task's model and a header,
    and a header of a size worth parsing.
    """
    limit = current_service().uploads.upload_limit(round, _device())
    return BodyRule(limit, weights.check_header_length, weights.HEADER_LENGTH_BYTES)


def _failure_rule(task_id: str) -> BodyRule:
    """A failure report: only with a device's token, and short."""
    _device()
    return BodyRule(MAX_FAILURE_BYTES)


def _validation_rule() -> BodyRule:
    """Shared validation clips: only from a device, only if this coordinator takes them."""
    _device()
    shared = current_service().shared_validation
    if shared is None:
        raise NotWanted("this coordinator takes no shared validation clips")
    return BodyRule(shared.max_body)


@bp.post(routes.DEVICES_RULE)
def register():
    """Register a device (again: with its token or secret); a new token, and its broker passwords."""
    try:
        reg = messages.decode(_body(_message_rule().limit), Registration)
    except ProtocolError as exc:
        return error(400, f"bad registration: {exc}")
    service = current_service()
    token = service.enrolment.register(reg, bearer())
    key = signing.public_key_text(service.key)
    logins = broker_users.device_logins(service.store.dir, reg.device_id)
    if logins is None:
        credentials = Credentials(reg.device_id, token, key)
    else:
        credentials = Credentials(reg.device_id, token, key, logins.password, logins.listen_password)
    return Response(messages.encode(credentials), mimetype="application/json")


@bp.get(routes.KEY_RULE)
def key():
    """The public key the coordinator signs tasks and model announcements with."""
    return jsonify(coordinator_key=signing.public_key_text(current_service().key))


@bp.get(routes.TASK_RULE)
def task():
    """What the fleet learns and the model it trains, for a device that is starting."""
    service = current_service()
    orchestrator = service.orchestrator
    info = TaskInfo(
        orchestrator.model.definition, service.uploads.current_spec(), orchestrator.config.secure_aggregation
    )
    return Response(messages.encode(info), mimetype="application/json")


@bp.get(routes.MODEL_RULE)
def model_file(round: int, kind: str):
    """Download the global model of a completed round."""
    service = current_service()
    path = service.store.model_path(round, kind)
    if not path.exists():
        return error(404, f"no {kind} for round {round}")
    token = bearer()  # a device's download is the round's traffic; a listener's or an operator's is not
    if token is not None and service.store.device_for_token(token) is not None:
        service.uploads.count_download(round, path.stat().st_size)
    return send_file(path, mimetype="application/octet-stream", max_age=0)


@bp.get(routes.RELAY_RULE)
def relayed_update(round: int, step: int):
    """Download the update a device's group passed on to it: only the device whose task trains from it."""
    service = current_service()
    path = service.uploads.relay_file(round, step, _device())
    if not path.exists():
        return error(404, f"no relayed update {step} in round {round}")
    return send_file(path, mimetype="application/octet-stream", max_age=0)


@bp.get(routes.ANNOUNCEMENT_RULE)
def announcement():
    """The latest model announcement, signed as on the broker (public, as there): a listener checks it
    before it trusts a retained one, which anyone on an open broker may have replaced.
    """
    payload = current_service().link.signed_announcement()
    if payload is None:
        return error(404, "no model announced yet")
    return Response(payload, mimetype="application/json")


@bp.get(routes.LATEST_MODEL_RULE)
@admin_only
def latest_model():
    """The latest completed round's record."""
    latest = current_service().store.latest_round()
    return (jsonify(asdict(latest)), 200) if latest else error(404, "no model yet")


@bp.post(routes.UPDATES_RULE)
def upload_update(round: int):
    """Accept a device's trained weights for the open round."""
    body = _body(_update_rule(round).limit)
    device = g.device_id
    service = current_service()
    service.uploads.receive_update(round, device, body, request.headers.get("X-Content-SHA256", ""))
    service.outcomes.accepted(device, round)
    return jsonify(accepted=True, device_id=device, round=round)


def _secure_sum_rule(round: int, phase: Phase) -> BodyRule:
    """A secure-sum message: only from a device the open phase expects, no larger than the phase takes."""
    return BodyRule(current_service().orchestrator.secure_uploads.body_limit(_device(), round, phase))


@bp.post(routes.SECURE_SUM_RULE)
def secure_sum_message(round: int, phase: Phase):
    """A device's message of the open phase of a round's secure sum."""
    body = _body(_secure_sum_rule(round, phase).limit)
    current_service().orchestrator.secure_uploads.take(g.device_id, round, phase, body)
    return jsonify(accepted=True)


@bp.get(routes.SECURE_SUM_RULE)
def secure_sum_outcome(round: int, phase: Phase):
    """A closed phase's outcome for the device asking; 202 while the phase is open."""
    reply = current_service().orchestrator.secure_uploads.outcome(_device(), round, phase)
    if reply is None:
        return jsonify(waiting=phase), 202
    return Response(reply, mimetype="application/json")


@bp.post(routes.ACK_RULE)
def acknowledge(task_id: str):
    """A device took its task: its round waits for its result (not for a device that only looks online)."""
    device = _device()
    current_service().uploads.acknowledge(device, task_id)
    return jsonify(acknowledged=True, device_id=device)


@bp.post(routes.FAILURE_RULE)
def report_failure(task_id: str):
    """A device could not do its task: its round stops waiting for it, and the reason is its last error.

    Only its own open task, with its token: anything else changes nothing.
    """
    body = _body(_failure_rule(task_id).limit)
    try:
        failure = messages.decode(body, TaskFailure)
    except ProtocolError as exc:
        return error(400, f"bad failure report: {exc}")
    device = g.device_id
    current_service().uploads.fail(device, task_id, failure.reason)
    return jsonify(reported=True, device_id=device)


@bp.post(routes.EVALUATIONS_RULE)
def upload_evaluation(round: int):
    """Accept a device's evaluation of a round's model on its own test split (counts only)."""
    body = _body(_device_message_rule().limit)
    device = g.device_id
    current_service().uploads.receive_evaluation(round, device, body)
    return jsonify(accepted=True, device_id=device, round=round)


@bp.post(routes.VALIDATION_RULE)
def share_validation():
    """Take the validation clips a device chose to share, if this coordinator takes any."""
    body = _body(_validation_rule().limit)
    shared = current_service().shared_validation
    assert shared is not None  # _validation_rule refused the request otherwise
    device = g.device_id
    clips = shared.receive(device, body)
    return jsonify(accepted=clips, device_id=device)


# endpoint -> what it takes as a body, checked by the HTTP server before the body is read (body_rules)
BODY_RULES: Rules = {
    "api.register": _message_rule,
    "api.upload_update": _update_rule,
    "api.upload_evaluation": _device_message_rule,
    "api.report_failure": _failure_rule,
    "api.share_validation": _validation_rule,
    "api.secure_sum_message": _secure_sum_rule,
}
