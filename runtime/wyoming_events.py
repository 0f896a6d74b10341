"""Wyoming events as a client sends them, read and checked within bounds (WyomingLimits).

wyoming's own reader takes an event's header line up to asyncio's limit and then reads its data and its
payload whole, whatever lengths the header gives. `read_event` checks each length before it reads the
bytes; `audio_format` checks an audio event's format. WyomingError says, in one line, what a client's
event breaks: the service closes that client's connection.
"""

import asyncio
import json
import math
from dataclasses import dataclass, fields
from typing import Any

from wyoming.event import Event

SAMPLE_WIDTH = 2  # bytes: 16-bit PCM, the only width the Listener takes
MAX_CHANNELS = 8
RATES = (4_000, 192_000)  # Hz: soxr's work and memory grow with the ratio to the model's rate


class WyomingError(Exception):
    """An event that breaks the protocol or the service's bounds: its connection is closed; the text says
    why, in one line.
    """


@dataclass(frozen=True)
class WyomingLimits:
    """Bounds on clients and their events; ValueError for a bound that is not positive.

    A satellite sends 1024-sample chunks (2 KiB at 16 kHz, 16-bit mono); 256 KiB is 8 s of that, 1.4 s of
    48 kHz stereo. Wake streams are endless by design (a satellite streams its microphone for hours), so
    only transcribe streams are bounded in length; the idle timeout closes a silent client.
    """

    max_clients: int = 8
    max_header_bytes: int = 64 * 1024  # an event's JSON header line
    max_data_bytes: int = 64 * 1024  # its JSON data part (data_length)
    max_payload_bytes: int = 256 * 1024  # its payload (payload_length): an audio chunk's samples
    idle_timeout_s: float = 60.0  # with no event from the client (or it not reading ours)
    max_transcribe_s: float = 300.0  # of audio in one transcribe stream

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.type is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{item.name} must be a positive whole number, not {value!r}")
            if item.type is float and not (
                isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf
            ):
                raise ValueError(f"{item.name} must be a positive number of seconds, not {value!r}")


async def read_event(reader: asyncio.StreamReader, limits: WyomingLimits) -> Event | None:
    """The next event, as wyoming.event.async_read_event reads it but bounded: each length is checked
    before its bytes are read. None at the end of the stream; WyomingError for a bad or oversized event.
    """
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise WyomingError("the connection ended inside an event's header") from None
        return None
    except asyncio.LimitOverrunError:
        raise WyomingError(f"an event's header line is longer than {limits.max_header_bytes} bytes") from None
    if len(line) - 1 > limits.max_header_bytes:
        raise WyomingError(f"an event's header line is longer than {limits.max_header_bytes} bytes")
    header = _json_object(line, "header")
    kind = header.get("type")
    if not isinstance(kind, str):
        raise WyomingError("an event's header has no type")
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise WyomingError(f"the data of event {shown(kind)} is not a JSON object")
    data_length = _length(header, "data_length", limits.max_data_bytes)
    payload_length = _length(header, "payload_length", limits.max_payload_bytes)
    try:
        if data_length:
            data = {**data, **_json_object(await reader.readexactly(data_length), "data")}
        payload = await reader.readexactly(payload_length) if payload_length else None
    except asyncio.IncompleteReadError:
        raise WyomingError(f"the connection ended inside event {shown(kind)}") from None
    return Event(type=kind, data=data, payload=payload)


def audio_format(event: Event) -> tuple[int, int]:
    """An audio-start's or audio-chunk's rate and channels; WyomingError unless it is 16-bit PCM in bounds."""
    rate, width, channels = (event.data.get(key) for key in ("rate", "width", "channels"))
    if not all(isinstance(value, int) and not isinstance(value, bool) for value in (rate, width, channels)):
        raise WyomingError(f"a {event.type} event without a whole rate, width and channels")
    assert isinstance(rate, int) and isinstance(channels, int)
    if width != SAMPLE_WIDTH:
        raise WyomingError(f"audio of {shown(width)} bytes a sample, not {SAMPLE_WIDTH} (16-bit PCM)")
    if not RATES[0] <= rate <= RATES[1]:
        raise WyomingError(f"a sample rate of {rate} Hz, not in {RATES[0]}..{RATES[1]}")
    if not 1 <= channels <= MAX_CHANNELS:
        raise WyomingError(f"{channels} channels, not 1..{MAX_CHANNELS}")
    return rate, channels


def _json_object(text: bytes, part: str) -> dict[str, Any]:
    """An event's header or data part as a JSON object; WyomingError if it is not one."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than the parser goes
        raise WyomingError(f"an event's {part} is not JSON") from None
    if not isinstance(value, dict):
        raise WyomingError(f"an event's {part} is not a JSON object")
    return value


def _length(header: dict[str, Any], key: str, bound: int) -> int:
    """A length from an event's header (absent: 0); WyomingError unless a whole number within bound."""
    value = header.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WyomingError(f"an event's {key} is {shown(value)}, not a length")
    if value > bound:
        raise WyomingError(f"an event's {key} of {value} bytes is over the bound of {bound}")
    return value


def shown(value: object) -> str:
    """A value from the network, quoted and cut short for a log line."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
