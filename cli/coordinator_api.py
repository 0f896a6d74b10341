"""The operator API as `fedspeech status` and `fedspeech devices` call it: options and requests."""

import argparse
import http.client
import json
from pathlib import Path
from typing import Any

from fedspeech.connection_options import read_secret

MAX_REPLY_BYTES = 16 * 1024 * 1024  # an overview of a large fleet and a long run fits well within it
TIMEOUT_S = 10.0


class CoordinatorApiError(Exception):
    """The coordinator could not be reached, or refused or failed the request; the text says which."""


def add_admin_options(
    parser: argparse.ArgumentParser, coordinator_help: str, default: str | None = None
) -> None:
    """--coordinator URL, and how to authenticate to it and trust its HTTPS."""
    parser.add_argument("--coordinator", metavar="URL", default=default, help=coordinator_help)
    parser.add_argument(
        "--admin-token-file",
        type=Path,
        metavar="FILE",
        help="the coordinator's admin token (its --admin-token-file), if it has one",
    )
    parser.add_argument("--coordinator-ca", type=Path, metavar="FILE", help="CA of the coordinator's HTTPS")


def admin_request(args: argparse.Namespace, method: str, path: str) -> Any:
    """The JSON reply of an API request with the admin token; CoordinatorApiError says what went wrong."""
    from fedspeech.protocol import routes
    from fedspeech.runtime.http_requests import connection_error, error_reason, https_context, request

    try:
        url = routes.url(args.coordinator, path)
    except ValueError:
        raise CoordinatorApiError(f"{args.coordinator!r} is not an http:// or https:// URL") from None
    try:
        context = https_context(args.coordinator_ca)
    except ValueError as exc:
        raise CoordinatorApiError(str(exc)) from None
    token = read_secret(args.admin_token_file, "admin token", args.command)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:  # one byte more than the limit shows a reply over it
        reply = request(
            method, url, headers=headers, timeout=TIMEOUT_S, limit=MAX_REPLY_BYTES + 1, context=context
        )
    except (OSError, http.client.HTTPException) as exc:  # refused, unreachable, timed out, TLS
        raise CoordinatorApiError(
            f"cannot reach the coordinator at {args.coordinator}: {connection_error(exc)}"
        ) from None
    if reply.status == 401:
        raise CoordinatorApiError(
            f"the coordinator wants its admin token (--admin-token-file FILE): {error_reason(reply)}"
        )
    if reply.status != 200:
        raise CoordinatorApiError(f"the coordinator answered {reply.status}: {error_reason(reply)}")
    if len(reply.body) > MAX_REPLY_BYTES:
        raise CoordinatorApiError(f"{path} answered more than {MAX_REPLY_BYTES} bytes")
    try:
        return json.loads(reply.body)
    except ValueError:
        raise CoordinatorApiError(
            f"{path} did not answer JSON: is {args.coordinator} a coordinator?"
        ) from None
