"""Wyoming events read within bounds: what wyoming's writer writes reads back; bad events are refused."""

import asyncio
import io

import pytest
from wyoming.audio import AudioChunk
from wyoming.event import Event, write_event
from wyoming.info import Describe
from wyoming.wake import Detect

from fedspeech.runtime.wyoming_events import WyomingError, WyomingLimits, read_event

pytestmark = pytest.mark.timeout(30)

SMALL = WyomingLimits(max_header_bytes=200, max_data_bytes=100, max_payload_bytes=64)


def written(*events: Event) -> bytes:
    """The bytes wyoming's own writer sends for events."""
    out = io.BytesIO()
    for event in events:
        write_event(event, out)
    return out.getvalue()


def read_all(sent: bytes, limits: WyomingLimits = SMALL) -> list[Event]:
    """The events read_event reads from sent, until the end of the stream."""

    async def main() -> list[Event]:
        reader = asyncio.StreamReader(limit=limits.max_header_bytes)
        reader.feed_data(sent)
        reader.feed_eof()
        events = []
        while (event := await read_event(reader, limits)) is not None:
            events.append(event)
        return events

    return asyncio.run(main())


def test_reads_what_wyoming_writes():
    chunk = AudioChunk(rate=16000, width=2, channels=1, audio=b"\x01\x02" * 32, timestamp=5).event()
    events = [Describe().event(), Detect(names=["7"]).event(), chunk]
    assert read_all(written(*events)) == events
    # the data part is merged into the header's own data, as wyoming merges it
    merged = b'{"type": "detect", "data": {"a": 1, "names": null}, "data_length": 16}\n{"names": ["7"]}'
    assert read_all(merged) == [Event("detect", {"a": 1, "names": ["7"]})]


BAD = [  # bytes sent, and the reason they are refused
    (b"not json\n", "header is not JSON"),
    (b"[" * 5000 + b"\n", "header line is longer than 200"),
    (b"\xff\xfe\n", "header is not JSON"),
    (b"[1, 2]\n", "header is not a JSON object"),
    (b'{"data": {}}\n', "has no type"),
    (b'{"type": 7}\n', "has no type"),
    (b'{"type": "detect", "data": [1]}\n', "data of event 'detect' is not a JSON object"),
    (b'{"type": "detect", "data_length": 101}\n', "data_length of 101 bytes is over the bound of 100"),
    (b'{"type": "detect", "data_length": -1}\n', "data_length is -1, not a length"),
    (b'{"type": "detect", "data_length": true}\n', "data_length is True, not a length"),
    (b'{"type": "detect", "data_length": 1.5}\n', "data_length is 1.5, not a length"),
    (b'{"type": "detect", "data_length": 2}\n[]', "data is not a JSON object"),
    (b'{"type": "detect", "data_length": 9}\n{"a": 1}', "ended inside event 'detect'"),
    (b'{"type": "audio-chunk", "payload_length": 65}\n', "payload_length of 65 bytes is over the bound"),
    (b'{"type": "audio-chunk", "payload_length": 4}\nab', "ended inside event 'audio-chunk'"),
    (b'{"type": "describe"', "ended inside an event's header"),
]


@pytest.mark.parametrize("sent, reason", BAD, ids=[reason for _, reason in BAD])
def test_a_bad_or_oversized_event_is_refused(sent, reason):
    with pytest.raises(WyomingError, match=reason.replace("(", r"\(")):
        read_all(sent)


def test_json_nested_deeper_than_the_parser_goes_is_refused():
    deep = b"[" * 100_000 + b"\n"
    with pytest.raises(WyomingError, match="header is not JSON"):
        read_all(deep, WyomingLimits(max_header_bytes=200_000))


def test_a_long_type_is_cut_short_in_the_reason():
    sent = b'{"type": "' + b"x" * 150 + b'", "data": 1}\n'
    with pytest.raises(WyomingError) as caught:
        read_all(sent)
    assert len(str(caught.value)) < 100


def test_the_end_of_the_stream_between_events_is_none():
    assert read_all(b"") == []


@pytest.mark.parametrize(
    "bad",
    [
        {"max_clients": 0},
        {"max_clients": True},
        {"max_clients": 2.0},
        {"max_header_bytes": -1},
        {"max_data_bytes": 0},
        {"max_payload_bytes": "1"},
        {"idle_timeout_s": 0},
        {"idle_timeout_s": float("inf")},
        {"idle_timeout_s": float("nan")},
        {"max_transcribe_s": -5.0},
    ],
)
def test_limits_must_be_positive(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        WyomingLimits(**bad)


def test_the_default_limits():
    limits = WyomingLimits()
    assert (limits.max_clients, limits.max_header_bytes, limits.max_data_bytes) == (8, 65536, 65536)
    assert (limits.max_payload_bytes, limits.idle_timeout_s, limits.max_transcribe_s) == (262144, 60.0, 300.0)
    assert WyomingLimits(idle_timeout_s=1).idle_timeout_s == 1  # a whole number of seconds will do
