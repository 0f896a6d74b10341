"""The operator's credential: with an admin token configured, only its holder sees the fleet or revokes."""

import base64
import binascii
import functools
import hmac
import logging
from collections.abc import Callable
from typing import Any

from flask import Response, current_app, jsonify, request

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


def refusal() -> Response | None:
    """None if the request may read the fleet's state; else the 401 that asks for the admin token.

    A Flask `before_request` hook: with no admin token configured, everyone may read.
    """
    expected = current_app.extensions["fedspeech"].admin_token
    authorization = request.headers.get("Authorization", "")
    if expected is None or holds_token(expected, authorization):
        return None
    # a browser's first request never carries the token; a wrong one is worth a warning
    level = logging.WARNING if authorization else logging.INFO
    log.log(level, "%s %s refused (401): no valid admin token", request.method, request.path)
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
