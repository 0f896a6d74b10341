"""The operator API as `fedspeech status` and `fedspeech devices` call it: options and requests."""

import argparse
import json
import ssl
import urllib.error
import urllib.request
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

    try:
        url = routes.url(args.coordinator, path)
    except ValueError:
        raise CoordinatorApiError(f"{args.coordinator!r} is not an http:// or https:// URL") from None
    token = read_secret(args.admin_token_file, "admin token", args.command)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        context = ssl.create_default_context(cafile=str(args.coordinator_ca)) if args.coordinator_ca else None
    except (OSError, ssl.SSLError) as exc:
        raise CoordinatorApiError(
            f"cannot use {args.coordinator_ca} as the coordinator's CA: {exc}"
        ) from None
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as reply:
            body = reply.read(MAX_REPLY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise CoordinatorApiError(_refusal(exc)) from None
    except (OSError, ValueError) as exc:  # refused, unreachable, timed out, TLS
        reason = getattr(exc, "reason", exc)
        raise CoordinatorApiError(f"cannot reach the coordinator at {args.coordinator}: {reason}") from None
    if len(body) > MAX_REPLY_BYTES:
        raise CoordinatorApiError(f"{path} answered more than {MAX_REPLY_BYTES} bytes")
    try:
        return json.loads(body)
    except ValueError:
        raise CoordinatorApiError(
            f"{path} did not answer JSON: is {args.coordinator} a coordinator?"
        ) from None


def _refusal(exc: urllib.error.HTTPError) -> str:
    """One line for an HTTP error: the coordinator's own reason where it gave one."""
    try:
        reason = json.loads(exc.read(4096))["error"]
    except (ValueError, KeyError, TypeError, OSError):
        reason = exc.reason
    if exc.code == 401:
        return f"the coordinator wants its admin token (--admin-token-file FILE): {reason}"
    return f"the coordinator answered {exc.code}: {reason}"
