"""HTTP API blueprint: registration, model downloads, update uploads, status, devices and rounds."""

import logging
import secrets
from dataclasses import asdict

from flask import Blueprint, Response, current_app, jsonify, request, send_file
from werkzeug.exceptions import RequestEntityTooLarge

from fedspeech.coordinator.orchestrator import UpdateRejected
from fedspeech.protocol import messages
from fedspeech.protocol.messages import Credentials, ProtocolError, Registration, TaskInfo

log = logging.getLogger(__name__)
bp = Blueprint("api", __name__, url_prefix="/api")

MAX_UPDATE_BYTES = 64 * 1024 * 1024


def _service():
    return current_app.extensions["fedspeech"]


def _error(status: int, reason: str) -> tuple[Response, int]:
    # 409 is routine: an over-selected device's update arriving after its round took the first K
    level = logging.INFO if status == 409 else logging.WARNING
    log.log(level, "%s %s rejected (%d): %s", request.method, request.path, status, reason)
    return jsonify(error=reason), status


@bp.post("/devices")
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


@bp.get("/task")
def task():
    """What the fleet learns and the model it trains, for a device that is starting."""
    orchestrator = _service().orchestrator
    info = TaskInfo(orchestrator.model.definition, orchestrator.current_spec())
    return Response(messages.encode(info), mimetype="application/json")


@bp.get("/models/<int:round>/<any(weights, onnx):kind>")
def model_file(round: int, kind: str):
    """Download the global model of a completed round."""
    service = _service()
    path = service.store.model_path(round, kind)
    if not path.exists():
        return _error(404, f"no {kind} for round {round}")
    service.orchestrator.count_download(round, path.stat().st_size)
    return send_file(path, mimetype="application/octet-stream", max_age=0)


@bp.get("/models/latest")
def latest_model():
    """The latest completed round's record."""
    latest = _service().store.latest_round()
    return (jsonify(asdict(latest)), 200) if latest else _error(404, "no model yet")


@bp.post("/rounds/<int:round>/updates")
def upload_update(round: int):
    """Accept a device's trained weights for the open round."""
    auth = request.headers.get("Authorization", "")
    if not auth.startswith("Bearer "):
        return _error(401, "missing bearer token")
    if (request.content_length or 0) > MAX_UPDATE_BYTES:
        return _error(413, "update too large")
    digest = request.headers.get("X-Content-SHA256", "")
    try:
        device = _service().orchestrator.receive_update(round, auth[7:], request.get_data(), digest)
    except UpdateRejected as exc:
        return _error(exc.status, exc.reason)
    return jsonify(accepted=True, device_id=device, round=round)


@bp.post("/rounds/<int:round>/evaluations")
def upload_evaluation(round: int):
    """Accept a device's evaluation of a round's model on its own test split (counts only)."""
    auth = request.headers.get("Authorization", "")
    if not auth.startswith("Bearer "):
        return _error(401, "missing bearer token")
    request.max_content_length = messages.MAX_MESSAGE_BYTES  # read no more than a report can be
    try:
        body = request.get_data()
    except RequestEntityTooLarge:
        return _error(413, "evaluation report too large")
    try:
        device = _service().orchestrator.receive_evaluation(round, auth[7:], body)
    except UpdateRejected as exc:
        return _error(exc.status, exc.reason)
    return jsonify(accepted=True, device_id=device, round=round)


@bp.get("/status")
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


@bp.get("/devices")
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


@bp.get("/rounds")
def rounds():
    """Every completed round with its metrics."""
    return jsonify([asdict(r) for r in _service().store.rounds()])


@bp.get("/rounds/<int:round>")
def round_detail(round: int):
    """One completed round and the updates aggregated into it."""
    store = _service().store
    record = next((r for r in store.rounds() if r.round == round), None)
    if record is None:
        return _error(404, f"round {round} is not complete")
    evaluations = [{**asdict(e), "accuracy": e.correct / e.clips} for e in store.device_evaluations(round)]
    return jsonify(
        {**asdict(record), "updates": [asdict(u) for u in store.updates(round)], "evaluations": evaluations}
    )
