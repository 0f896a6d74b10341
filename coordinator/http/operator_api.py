"""The operator's HTTP API: status, devices, rounds and revocation, as routes of the API's blueprint."""

from dataclasses import asdict
from typing import Any

from flask import Response, jsonify

from fedspeech.coordinator.fleet.enrolment import revoke_device, revoked_reason
from fedspeech.coordinator.http.admin import admin_only, is_admin, refusal
from fedspeech.coordinator.http.api import Unauthorized, bearer, bp, current_service, error
from fedspeech.coordinator.http.overview import standing
from fedspeech.protocol import routes


@bp.get(routes.STATUS_RULE)
def status() -> Response:
    """What the coordinator is doing now: its rounds to anyone, its devices and broker to the operator."""
    service = current_service()
    latest = service.store.latest_round()
    answer: dict[str, Any] = {
        "completed_round": latest.round if latest else None,
        # the latest round's federated accuracy, with the devices and test clips it rests on
        "federated": (
            {
                "accuracy": latest.federated_accuracy,
                "devices": latest.evaluation_reports,
                "clips": latest.evaluation_clips,
            }
            if latest is not None and latest.federated_accuracy is not None
            else None
        ),
        "open_round": service.uploads.open_round(),
        "target_rounds": service.orchestrator.config.rounds,
        "finished": service.orchestrator.finished.is_set(),
    }
    if is_admin():  # devices measure their round trip here without the admin token; they learn no ids
        registered = service.store.registered()  # anyone on the broker can claim a device id there
        answer["devices_online"] = [d for d in service.link.online() if d in registered]
        answer["broker"] = service.broker_url
        # the last task each device could not do, and why, since the coordinator started, until it recovers
        errors, last = service.uploads.last_errors(), service.outcomes.last()
        standing_errors = {d: e for d in sorted(errors) if (e := standing(errors[d], last.get(d)))}
        answer["device_errors"] = {d: asdict(e) for d, e in standing_errors.items()}
        # what keeps the next round from starting, and how to change it (it tells how many are online)
        answer["waiting"] = service.orchestrator.waiting
    return jsonify(answer)


@bp.get(routes.DEVICES_RULE)
@admin_only
def devices() -> Response:
    """Known devices (registered or enrolled) with their latest MQTT status and clips per label."""
    service = current_service()
    statuses, shared = service.link.statuses(), service.enrolment.shared_ids()
    listed = []
    for device in service.store.devices():
        status = statuses.get(device.device_id)
        listed.append(
            {
                **asdict(device),
                "state": status.state if status else "unknown",
                "train_counts": status.train_counts if status else {},
                "test_counts": status.test_counts if status else {},
                "shared_id": device.device_id in shared,
            }
        )
    return jsonify(listed)


@bp.get(routes.ROUNDS_RULE)
@admin_only
def rounds() -> Response:
    """Every completed round with its metrics."""
    return jsonify([asdict(r) for r in current_service().store.rounds()])


@bp.get(routes.ROUND_RULE)
@admin_only
def round_detail(round: int) -> Response | tuple[Response, int]:
    """One completed round and the updates aggregated into it."""
    store = current_service().store
    record = next((r for r in store.rounds() if r.round == round), None)
    if record is None:
        return error(404, f"round {round} is not complete")
    evaluations = [{**asdict(e), "accuracy": e.accuracy} for e in store.device_evaluations(round)]
    return jsonify(
        {**asdict(record), "updates": [asdict(u) for u in store.updates(round)], "evaluations": evaluations}
    )


@bp.get(routes.DEVICE_RULE)
def device_record(device_id: str) -> Response | tuple[Response, int]:
    """One device's record, for its own token (its daemon checks it was not revoked) or the admin token."""
    service = current_service()
    token = bearer()
    if token is None or service.store.device_for_token(token) != device_id:
        if token is not None and service.store.revoked_device(token) == device_id:
            raise Unauthorized(revoked_reason(device_id), revoked=True)
        refused = refusal()  # the same answer for every id without the device's token or the admin's
        if refused is not None:
            return refused
    record = service.store.device(device_id)
    return jsonify(asdict(record)) if record else error(404, f"no device {device_id[:64]!r}")


@bp.delete(routes.DEVICE_RULE)
@admin_only
def revoke(device_id: str) -> Response | tuple[Response, int]:
    """Revoke a device: its token stops working and it must be enrolled again. Only with an admin token."""
    service = current_service()
    if service.admin_token is None:
        return error(
            403,
            "this coordinator has no admin token (--admin-token-file): revoke beside its state with "
            "`fedspeech devices revoke ID --state DIR`",
        )
    if not revoke_device(service.store, device_id):
        return error(404, f"no device {device_id[:64]!r}")
    return jsonify(revoked=device_id)
