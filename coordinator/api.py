"""HTTP API blueprint: registration, model downloads, update uploads, status, devices and rounds."""

import logging
import secrets
from dataclasses import asdict

from flask import Blueprint, Response, current_app, jsonify, request, send_file
from werkzeug.exceptions import RequestEntityTooLarge

from fedspeech.coordinator.errors import BadUpload, NotWanted
from fedspeech.protocol import messages, routes
from fedspeech.protocol.messages import Credentials, ProtocolError, Registration, TaskInfo

log = logging.getLogger(__name__)
bp = Blueprint("api", __name__, url_prefix=routes.PREFIX)

MAX_UPDATE_BYTES = 64 * 1024 * 1024


def _service():
    return current_app.extensions["fedspeech"]


def _error(status: int, reason: str) -> tuple[Response, int]:
    # 409 is routine: an over-selected device's update arriving after its round took the first K
    level = logging.INFO if status == 409 else logging.WARNING
    log.log(level, "%s %s rejected (%d): %s", request.method, request.path, status, reason)
    return jsonify(error=reason), status


class _Unauthorized(Exception):
    """No bearer token, or one the coordinator never issued."""


class _TooLarge(Exception):
    """A body over the size its route allows."""


_STATUSES = {BadUpload: 400, _Unauthorized: 401, NotWanted: 409, _TooLarge: 413}


@bp.errorhandler(BadUpload)
@bp.errorhandler(NotWanted)
@bp.errorhandler(_Unauthorized)
@bp.errorhandler(_TooLarge)
def _refused(exc: Exception) -> tuple[Response, int]:
    return _error(_STATUSES[type(exc)], str(exc))


def _body(limit: int) -> bytes:
    """The request body, read no further than limit bytes; counted as the open round's traffic."""
    request.max_content_length = limit
    try:
        body = request.get_data()
    except RequestEntityTooLarge:
        raise _TooLarge(f"body larger than {limit} bytes") from None
    _service().orchestrator.count_upload(len(body))
    return body


def _device() -> str:
    """The device whose bearer token authorises this request."""
    auth = request.headers.get("Authorization", "")
    if not auth.startswith("Bearer "):
        raise _Unauthorized("missing bearer token")
    device_id = _service().store.device_for_token(auth.removeprefix("Bearer "))
    if device_id is None:
        raise _Unauthorized("unknown bearer token")
    return device_id


@bp.post(routes.DEVICES_RULE)
def register():
    """Register a device (or re-register it) and issue its bearer token."""
    try:
        reg = messages.decode(request.get_data(), Registration)
    except ProtocolError as exc:
        return _error(400, f"bad registration: {exc}")
    token = secrets.token_urlsafe(32)
    _service().store.register_device(reg.device_id, token, reg.num_samples, asdict(reg.profile))
    log.info("registered device %s (%d samples)", reg.device_id, reg.num_samples)
    return Response(messages.encode(Credentials(reg.device_id, token)), mimetype="application/json")


@bp.get(routes.TASK_RULE)
def task():
    """What the fleet learns and the model it trains, for a device that is starting."""
    orchestrator = _service().orchestrator
    info = TaskInfo(orchestrator.model.definition, orchestrator.current_spec())
    return Response(messages.encode(info), mimetype="application/json")


@bp.get(routes.MODEL_RULE)
def model_file(round: int, kind: str):
    """Download the global model of a completed round."""
    service = _service()
    path = service.store.model_path(round, kind)
    if not path.exists():
        return _error(404, f"no {kind} for round {round}")
    service.orchestrator.count_download(round, path.stat().st_size)
    return send_file(path, mimetype="application/octet-stream", max_age=0)


@bp.get(routes.LATEST_MODEL_RULE)
def latest_model():
    """The latest completed round's record."""
    latest = _service().store.latest_round()
    return (jsonify(asdict(latest)), 200) if latest else _error(404, "no model yet")


@bp.post(routes.UPDATES_RULE)
def upload_update(round: int):
    """Accept a device's trained weights for the open round."""
    body = _body(MAX_UPDATE_BYTES)
    device = _device()
    _service().orchestrator.receive_update(round, device, body, request.headers.get("X-Content-SHA256", ""))
    return jsonify(accepted=True, device_id=device, round=round)


@bp.post(routes.EVALUATIONS_RULE)
def upload_evaluation(round: int):
    """Accept a device's evaluation of a round's model on its own test split (counts only)."""
    body = _body(messages.MAX_MESSAGE_BYTES)
    device = _device()
    _service().orchestrator.receive_evaluation(round, device, body)
    return jsonify(accepted=True, device_id=device, round=round)


@bp.get(routes.STATUS_RULE)
def status():
    """What the coordinator is doing now."""
    service = _service()
    latest = service.store.latest_round()
    return jsonify(
        completed_round=latest.round if latest else None,
        open_round=service.orchestrator.open_round(),
        target_rounds=service.orchestrator.config.rounds,
        finished=service.orchestrator.finished.is_set(),
        devices_online=service.link.online(),
        broker=service.broker_url,
    )


@bp.get(routes.DEVICES_RULE)
def devices():
    """Registered devices with their latest MQTT status and usable clips per label (counts only)."""
    service = _service()
    statuses = service.link.statuses()
    listed = []
    for device in service.store.devices():
        status = statuses.get(device.device_id)
        listed.append(
            {
                **asdict(device),
                "state": status.state if status else "unknown",
                "train_counts": status.train_counts if status else {},
                "test_counts": status.test_counts if status else {},
            }
        )
    return jsonify(listed)


@bp.get(routes.ROUNDS_RULE)
def rounds():
    """Every completed round with its metrics."""
    return jsonify([asdict(r) for r in _service().store.rounds()])


@bp.get(routes.ROUND_RULE)
def round_detail(round: int):
    """One completed round and the updates aggregated into it."""
    store = _service().store
    record = next((r for r in store.rounds() if r.round == round), None)
    if record is None:
        return _error(404, f"round {round} is not complete")
    evaluations = [{**asdict(e), "accuracy": e.accuracy} for e in store.device_evaluations(round)]
    return jsonify(
        {**asdict(record), "updates": [asdict(u) for u in store.updates(round)], "evaluations": evaluations}
    )
