"""The dashboard: one read-only page at `/` that polls `/api/overview`, which `fedspeech status` reads too."""

from dataclasses import asdict

from flask import Blueprint, Response, current_app, jsonify, send_from_directory

from fedspeech.coordinator.http.admin import refusal
from fedspeech.coordinator.http.overview import overview
from fedspeech.protocol import routes

bp = Blueprint("dashboard", __name__, static_folder="web", static_url_path="/assets")
bp.before_request(refusal)


# the page builds every element from text, never from markup: device-sent strings cannot become script
POLICY = (
    "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


@bp.after_request
def _harden(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/")
def page() -> Response:
    """The dashboard page."""
    return send_from_directory(bp.static_folder or "web", "index.html", max_age=0)


@bp.get(routes.OVERVIEW)
def overview_json() -> Response:
    """Devices, rounds and the current model, as JSON."""
    service = current_app.extensions["fedspeech"]
    return jsonify(asdict(overview(service.store, service.link, service.orchestrator, service.outcomes)))
