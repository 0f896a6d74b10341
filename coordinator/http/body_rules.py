"""What a route takes as a request body, decided from the request's headers before the body is read.

A route that takes a body may have a rule: a function of its URL's values that checks what the headers
show (the bearer token, the task the body answers) and returns the body's limit, or raises the route's
own refusal. The HTTP server runs it before it reads a byte of the body, so that a refused body is never
held in memory, and the route runs it again on the whole request.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flask import Flask, Response, request

from fedspeech.protocol.messages import MAX_MESSAGE_BYTES

DEFAULT_LIMIT = MAX_MESSAGE_BYTES  # a route without a rule takes no larger body


@dataclass(frozen=True)
class BodyRule:
    """The largest body a request may send, and a check of its first bytes before the rest is read."""

    limit: int
    check_start: Callable[[bytes], None] | None = None  # ValueError: the body is refused (400)
    start_bytes: int = 0  # how many first bytes check_start reads


Rules = Mapping[str, Callable[..., BodyRule]]  # endpoint -> its rule, called with the URL's values


def admit(app: Flask, environ: dict[str, Any], rules: Rules) -> BodyRule | Response:
    """The rule for a request's body, from its route's rule and the request's headers; or the answer that
    refuses the request, from the route's own error handlers.

    environ: the request's WSGI environment without its body. A path no route has gets DEFAULT_LIMIT: the
    app answers it as it would any request.
    """
    with app.request_context(environ):
        rule = rules.get(request.endpoint or "") if request.routing_exception is None else None
        if rule is None:
            return BodyRule(DEFAULT_LIMIT)
        try:
            return rule(**(request.view_args or {}))
        except Exception as exc:  # a refusal its error handlers answer; one they do not is raised again
            return app.make_response(app.handle_user_exception(exc))
