"""The dashboard: one read-only page at `/` that polls `/api/overview`, which `fedspeech status` reads too."""

import time
from dataclasses import asdict

from flask import Blueprint, Response, current_app, jsonify, send_from_directory
from flask.blueprints import BlueprintSetupState

from fedspeech.coordinator.config import APP_KEY
from fedspeech.coordinator.http.admin import refusal
from fedspeech.coordinator.http.overview import FirstModel, init_in_words, overview
from fedspeech.protocol import routes

bp = Blueprint("dashboard", __name__, static_folder="web", static_url_path="/assets")
bp.before_request(refusal)
START_KEY = "fedspeech.first_model"  # the app's FirstModel in app.extensions


@bp.record_once
def _note_start(state: BlueprintSetupState) -> None:
    """Note how the app would make a new fleet's first model, and when: a round 0 made since is its."""
    config = state.app.config.get(APP_KEY)
    if config is not None:
        made_from = init_in_words(config.service.init, config.service.init_data)
        state.app.extensions[START_KEY] = FirstModel(made_from, time.time())


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
    start = current_app.extensions.get(START_KEY)
    return jsonify(
        asdict(overview(service.store, service.link, service.orchestrator, service.outcomes, start))
    )
