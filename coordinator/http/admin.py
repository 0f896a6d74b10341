"""The operator's credential: with an admin token configured, only its holder sees the fleet or revokes."""

import base64
import binascii
import functools
import hmac
import logging
from collections.abc import Callable
from typing import Any

from flask import Response, current_app, jsonify, request

from fedspeech.coordinator.http.wrong_tokens import BURST

log = logging.getLogger(__name__)

# a browser asks its user for the token on this challenge, and sends it with every poll after
CHALLENGE = 'Basic realm="fedspeech coordinator", charset="UTF-8"'


def presented_token(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer` header, or the password of a Basic one; else None."""
    if authorization.startswith("Bearer "):
        return authorization.removeprefix("Bearer ")
    if authorization.startswith("Basic "):
        try:
            user_and_password = base64.b64decode(authorization.removeprefix("Basic "), validate=True)
            return user_and_password.decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return None
    return None


def holds_token(expected: str, authorization: str) -> bool:
    """Whether the header presents the expected admin token (compared in constant time)."""
    token = presented_token(authorization)
    return token is not None and hmac.compare_digest(token.encode(), expected.encode())


def _verdict() -> tuple[int, int]:
    """(200, 0) if the request may read the fleet's state; (401, 0) if not; (429, seconds) if it must wait.

    With no admin token configured, everyone may read. The right token is let in from any address: one
    who shares the operator's address (behind one NAT) cannot lock the operator out by guessing. A wrong
    token counts against its address, which once out of tries gets 429 and is not logged again until it
    may try; what keeps the token from being guessed is its length (at least 32 characters of chance).
    """
    service = current_app.extensions["fedspeech"]
    if service.admin_token is None:
        return 200, 0
    authorization = request.headers.get("Authorization", "")
    if holds_token(service.admin_token, authorization):
        return 200, 0
    address = request.remote_addr or ""
    wait = service.admin_guesses.retry_after(address)
    if wait:
        return 429, wait
    if authorization and service.admin_guesses.failed(address):
        log.warning("%d wrong admin tokens from %s: it has to wait before it tries again", BURST, address)
    return 401, 0


def is_admin() -> bool:
    """Whether the request holds the admin token (or none is configured); a wrong one counts as a guess."""
    return _verdict()[0] == 200


def refusal() -> Response | None:
    """None if the request may read the fleet's state; else the 401 that asks for the admin token, or 429.

    A Flask `before_request` hook: with no admin token configured, everyone may read.
    """
    status, wait = _verdict()
    if status == 200:
        return None
    authorization = request.headers.get("Authorization", "")
    # a browser's first request never carries the token; a wrong one is worth a warning (once out of tries,
    # the address was warned about)
    level = logging.WARNING if authorization and status == 401 else logging.INFO
    log.log(level, "%s %s refused (%d): no valid admin token", request.method, request.path, status)
    if status == 429:
        response = jsonify(error=f"too many wrong admin tokens from this address: try again in {wait} s")
        response.status_code = 429
        response.headers["Retry-After"] = str(wait)
        return response
    response = jsonify(
        error="the admin token is needed: `Authorization: Bearer TOKEN`, or any user name and the token as "
        "password"
    )
    response.status_code = 401
    response.headers["WWW-Authenticate"] = CHALLENGE
    return response


def admin_only(view: Callable[..., Any]) -> Callable[..., Any]:
    """A view that answers only the admin token's holder, where one is configured."""

    @functools.wraps(view)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        return refusal() or view(*args, **kwargs)

    return guarded
