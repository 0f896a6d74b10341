"""`fedspeech status`: the fleet's devices and the last rounds, as tables, from the coordinator's API."""

import argparse
from typing import Any

from fedspeech.coordinator_api import CoordinatorApiError, add_admin_options, admin_request


def run(args: argparse.Namespace) -> None:
    """Print the coordinator's overview."""
    from fedspeech.protocol import routes

    if args.rounds < 0:
        raise SystemExit("fedspeech status: --rounds must be 0 or more")
    try:
        overview = admin_request(args, "GET", routes.OVERVIEW)
        print(render(overview, args.coordinator, args.rounds))
    except CoordinatorApiError as exc:
        raise SystemExit(f"fedspeech status: {exc}") from None
    except (KeyError, TypeError, AttributeError):
        raise SystemExit(
            f"fedspeech status: {args.coordinator} answered an overview this version cannot read"
        ) from None


def render(o: dict[str, Any], coordinator: str, last_rounds: int) -> str:
    """The overview as a summary line and two tables: devices, and the last rounds, newest first."""
    done = (
        "no round yet"
        if o["completed_round"] is None
        else f"round {o['completed_round']} of {o['target_rounds']}"
    )
    now = (
        "finished"
        if o["finished"]
        else o.get("waiting") or "idle"  # a coordinator of an earlier version says nothing of its waits
        if o["open_round"] is None
        else f"round {o['open_round']} training"
    )
    privacy = o.get("privacy") or "updates in the clear"  # a coordinator of an earlier version says nothing
    secure = "" if privacy == "updates in the clear" else f" ({privacy})"
    lines = [
        f"{coordinator}: {o['task']}, {o['strategy']}{secure}, {done}, {now}, "
        f"{o['devices_online']} of {len(o['devices'])} devices online"
    ]
    if o["model"]:
        m = o["model"]
        onnx = f", ONNX {_bytes(m['onnx_bytes'])} at {m['onnx_url']}" if m["onnx_url"] else ""
        lines.append(
            f"model: round {m['round']}, {m['architecture']}, weights {_bytes(m['weights_bytes'])}{onnx}"
        )
        if o.get("first_model"):
            lines.append(f"first model (round 0): {o['first_model']}")
        if m.get("threshold_from"):
            threshold = f"threshold {m['threshold']:.3f}, " if m.get("threshold") is not None else ""
            lines.append(f"detection: {threshold}{m['threshold_from']}")
    lines.append("")
    devices = [
        [
            d["device_id"],
            d["state"] if d["online"] else "offline" if d["registered"] else "enrolled",
            _number(d["score"], 2),
            str(d["num_samples"]),
            _missing(d.get("missing_labels")),  # a coordinator of an earlier version has none
            _ago(d["last_seen"], o["at"]),
            str(d["rounds_joined"]),
            _update(d["last_update"]),
            _error(d.get("last_error")),  # a coordinator of an earlier version has none
        ]
        for d in o["devices"]
    ]
    header = ["DEVICE", "STATE", "SCORE", "CLIPS", "MISSING", "LAST SEEN", "ROUNDS", "LAST UPDATE",
              "LAST ERROR"]  # fmt: skip
    lines += _table(header, devices)
    lines.append("")
    rounds = [
        [
            str(r["round"]), str(r["devices"]), str(r["results"]), str(r["withdrawn"]), str(r["stragglers"]),
            f"{r['wall_s']:.1f}", _bytes(r["bytes_up"]), _bytes(r["bytes_down"]),
            _number(r["accuracy"], 4), _number(r["loss"], 4), _number(r["federated_accuracy"], 4),
        ]
        for r in reversed(o["rounds"][-last_rounds:] if last_rounds else [])
    ]  # fmt: skip
    header = ["ROUND", "SELECTED", "FINISHED", "WITHDRAWN", "STRAGGLERS", "SECONDS", "UP", "DOWN",
              "ACCURACY", "LOSS", "FEDERATED"]  # fmt: skip
    lines += _table(header, rounds)
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Rows under a header, in columns as wide as their widest cell."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size, unit = float(n), "B"
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            break
        size /= 1000
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"


MISSING_SHOWN = 3  # labels named in the MISSING column; the rest counted


def _missing(labels: list[str] | None) -> str:
    """The labels a device has no clip of: '-' where it did not say, 'none' where it has all."""
    if labels is None:
        return "-"
    if not labels:
        return "none"
    more = len(labels) - MISSING_SHOWN
    return ",".join(labels[:MISSING_SHOWN]) + (f" +{more}" if more > 0 else "")


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return "never"
    seconds = max(0.0, now - at)
    return f"{seconds:.0f} s ago" if seconds < 90 else f"{seconds / 60:.0f} min ago"


def _update(outcome: dict[str, Any] | None) -> str:
    if outcome is None:
        return "-"
    if outcome["accepted"]:
        return f"round {outcome['round']}: accepted"
    return f"round {outcome['round']}: rejected, {outcome['reason'][:60]}"


def _error(error: dict[str, Any] | None) -> str:
    if error is None:
        return "-"
    return f"round {error['round']}: {error['reason'][:60]}"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `status` to the command line."""
    s = subparsers.add_parser("status", help="devices and the last rounds of a running coordinator")
    add_admin_options(
        s, "the coordinator's base URL (default http://127.0.0.1:8080)", "http://127.0.0.1:8080"
    )
    s.add_argument("--rounds", type=int, default=5, help="how many of the last rounds to show (default 5)")
    s.set_defaults(run=run)
