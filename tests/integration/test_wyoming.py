"""The Wyoming service (runtime.wyoming_service) as Home Assistant and a satellite use it: wyoming's own
AsyncTcpClient over real TCP, the session's FSDD model, held-out recordings resampled to 16 kHz 16-bit
mono (and 44.1 kHz stereo) and sent in 1024-sample chunks; the bounds: bad events, too many clients, idle
clients, long transcribe streams; and the blocking run_wyoming stopped by a signal.
"""

import asyncio
import contextlib
import logging
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import soxr
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.wake import Detect, Detection, NotDetected

from fedspeech.runtime.session import OnnxModel, load_local
from fedspeech.runtime.streaming import Detection as HeardWord
from fedspeech.runtime.wyoming_events import WyomingLimits
from fedspeech.runtime.wyoming_service import serve
from tests.helpers.ports import free_port
from tests.helpers.recordings import held_out_digits
from tests.helpers.waiting import wait_for

FSDD_RATE, RATE, CHUNK = 8000, 16000, 1024  # a satellite's rate and chunk (samples)
PAUSE_S = 0.6
READ_S = 10.0  # at most, for one event the service owes

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model(fsdd_model) -> OnnxModel:
    """The session's model, loaded as `fedspeech listen --model` loads it."""
    return load_local(fsdd_model.onnx_path)


def take(
    digits: str, speaker: str, number: int, rate: int = RATE, channels: int = 1
) -> tuple[bytes, list[tuple[float, float]]]:
    """A speaker's held-out takes of digits (FSDD's recordings 0-4), PAUSE_S apart and around, resampled
    to rate as 16-bit little-endian PCM, the same in each channel; and each digit's span in seconds.
    """
    audio, spans = held_out_digits(digits, speaker, number, PAUSE_S)
    audio = soxr.resample(audio, FSDD_RATE, rate)
    return pcm(np.repeat(audio[:, None], channels, axis=1)), spans


def pcm(audio: np.ndarray) -> bytes:
    """Float samples as 16-bit little-endian PCM."""
    return (np.clip(audio, -1, 32767 / 32768) * 32768).astype("<i2").tobytes()


def chunks(audio: bytes, rate: int = RATE, channels: int = 1) -> list[Event]:
    """audio-chunk events of CHUNK samples, as a satellite sends them."""
    size = CHUNK * 2 * channels
    return [
        AudioChunk(rate=rate, width=2, channels=channels, audio=audio[i : i + size]).event()
        for i in range(0, len(audio), size)
    ]


def run(
    model: OnnxModel,
    scenario: Callable[[int], Awaitable[Any]],
    limits: WyomingLimits | None = None,
    heard: list[HeardWord] | None = None,
) -> Any:
    """Serve model on a free port in this test's event loop, run scenario(port) against it, stop it."""

    async def main() -> Any:
        port, ready = free_port(), asyncio.Event()
        on_detection = None if heard is None else heard.append
        server = asyncio.create_task(
            serve(f"tcp://127.0.0.1:{port}", model, limits=limits, on_detection=on_detection, ready=ready)
        )
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait([server, waiting], timeout=30, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if server.done():
            server.result()  # raises what stopped it
        assert ready.is_set(), "the service did not start"
        try:
            return await scenario(port)
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server

    return asyncio.run(main())


def client(port: int) -> AsyncTcpClient:
    """Home Assistant's client of a Wyoming service."""
    return AsyncTcpClient("127.0.0.1", port, connect_timeout=5, read_timeout=READ_S)


async def send(connection: AsyncTcpClient, *events: Event) -> None:
    """Write events in order."""
    for event in events:
        await connection.write_event(event)


async def until_pong(connection: AsyncTcpClient) -> list[Event]:
    """Ping, and the events the service sent before its pong: all it had to say until then."""
    await connection.write_event(Ping(text="barrier").event())
    events: list[Event] = []
    while True:
        event = await connection.read_event()
        assert event is not None, "the service closed the connection"
        if Pong.is_type(event.type):
            return events
        events.append(event)


async def detections(connection: AsyncTcpClient, count: int) -> list[Detection]:
    """The next count events, each a detection."""
    found = []
    for _ in range(count):
        event = await connection.read_event()
        assert event is not None and Detection.is_type(event.type), event
        found.append(Detection.from_event(event))
    return found


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the service closes the connection (within READ_S) without a word."""
    try:
        return await asyncio.wait_for(reader.read(1), READ_S) == b""
    except ConnectionResetError:  # closed with bytes of ours unread
        return True


async def client_closed(connection: AsyncTcpClient) -> bool:
    """Whether the service closes a wyoming client's connection (within READ_S) without a word."""
    try:
        return await connection.read_event() is None
    except ConnectionResetError:
        return True


def test_describe_lists_the_models_words(model):
    async def scenario(port: int) -> Info:
        async with client(port) as connection:
            await connection.write_event(Describe().event())
            event = await connection.read_event()
        assert event is not None and Info.is_type(event.type)
        return Info.from_event(event)

    info = run(model, scenario)
    words = [label for label in model.labels if label != "_none_"]
    assert words == [str(digit) for digit in range(10)]
    (wake,) = info.wake
    assert (wake.name, wake.installed) == ("fedspeech", True) and wake.attribution.name == "fedspeech"
    assert [m.name for m in wake.models] == words
    assert [m.phrase for m in wake.models] == [model.spoken(word) for word in words]
    assert all(m.languages == ["en"] and m.version == "1" and m.installed for m in wake.models)
    (asr,) = info.asr
    assert asr.name == "fedspeech" and [(m.name, m.languages) for m in asr.models] == [("fsdd", ["en"])]


def test_wake_words_are_detected_as_they_are_heard(model):
    digits = "27183"
    audio, spans = take(digits, "theo", 0)
    rng = np.random.default_rng(0)
    hiss = pcm(0.002 * rng.standard_normal(3 * RATE))
    heard: list[HeardWord] = []

    async def scenario(port: int) -> tuple[list[Detection], list[Event], list[Event]]:
        async with client(port) as connection:
            await send(connection, Detect().event(), AudioStart(rate=RATE, width=2, channels=1).event())
            await send(connection, *chunks(audio + bytes(2 * RATE)))  # a second of silence after the last
            found = await detections(connection, len(digits))  # before audio-stop: as they are heard
            await connection.write_event(AudioStop().event())
            after_stop = await until_pong(connection)
            # a second stream on the same connection, of hiss alone, after detect names no word heard
            await send(
                connection, Detect(names=["2"]).event(), AudioStart(rate=RATE, width=2, channels=1).event()
            )
            await send(connection, *chunks(hiss), AudioStop().event())
            return found, after_stop, await until_pong(connection)

    found, after_stop, hiss_events = run(model, scenario, heard=heard)
    assert [d.name for d in found] == list(digits)
    stamps = [d.timestamp for d in found]
    assert all(isinstance(t, int) for t in stamps) and stamps == sorted(stamps)
    for detection, (start, end) in zip(found, spans, strict=True):
        assert detection.timestamp is not None and start * 1000 < detection.timestamp <= end * 1000 + 50
    assert after_stop == []  # words were detected: no not-detected
    assert [e.type for e in hiss_events] == [NotDetected().event().type]
    assert [w.label for w in heard] == list(digits)  # the hook heard each


def test_a_detect_names_filter_and_a_stream_without_audio_start(model):
    """A satellite sends detect and its microphone's chunks, no audio-start: the chunk opens the stream."""
    audio, _ = take("2718", "theo", 3)

    async def scenario(port: int) -> list[Event]:
        async with client(port) as connection:
            await send(connection, Detect(names=["7", "8"]).event(), *chunks(audio), AudioStop().event())
            return await until_pong(connection)

    events = run(model, scenario)
    assert [Detection.from_event(e).name for e in events] == ["7", "8"]


@pytest.mark.parametrize("rate, channels", [(RATE, 1), (44100, 2)], ids=["16 kHz mono", "44.1 kHz stereo"])
def test_transcribe_returns_the_spoken_digit(model, rate, channels):
    audio, _ = take("7", "yweweler", 2, rate, channels)

    async def scenario(port: int) -> list[Event]:
        async with client(port) as connection:
            await connection.write_event(Transcribe(language="en").event())
            start = AudioStart(rate=rate, width=2, channels=channels).event()
            await send(connection, start, *chunks(audio, rate, channels), AudioStop().event())
            return await until_pong(connection)

    (event,) = run(model, scenario)
    assert Transcript.is_type(event.type)
    transcript = Transcript.from_event(event)
    assert (transcript.text, transcript.language) == (model.spoken("7"), "en")


def test_two_clients_at_once_each_hear_their_own_words(model):
    first, _ = take("2718", "theo", 0)
    second, _ = take("9046", "lucas", 4)

    async def scenario(port: int) -> tuple[list[str], list[str]]:
        async with client(port) as one, client(port) as two:
            start = AudioStart(rate=RATE, width=2, channels=1).event()
            await send(one, Detect().event(), start)
            await send(two, Transcribe().event(), start)
            a, b = chunks(first), chunks(second)
            for i in range(max(len(a), len(b))):
                if i < len(a):
                    await one.write_event(a[i])
                if i < len(b):
                    await two.write_event(b[i])
            await send(one, AudioStop().event())
            await send(two, AudioStop().event())
            heard_one = [Detection.from_event(e).name or "" for e in await until_pong(one)]
            (transcript,) = await until_pong(two)
            return heard_one, Transcript.from_event(transcript).text.split()

    heard_one, heard_two = run(model, scenario)
    assert heard_one == list("2718")
    assert heard_two == [model.spoken(digit) for digit in "9046"]


BAD_EVENTS = {  # the bytes a client sends, and why the service closes its connection
    "bad JSON": (b'{"type": "describe"\n', "header is not JSON"),
    "a header line over the bound": (b'{"type": "' + b"a" * (64 * 1024) + b'"}\n', "header line is longer"),
    "payload_length over the bound": (
        b'{"type": "audio-chunk", "payload_length": 262145}\n',
        "payload_length of 262145 bytes is over the bound of 262144",
    ),
    "data_length over the bound": (b'{"type": "describe", "data_length": 65537}\n', "data_length of 65537"),
    "JSON nested too deep": (b"[" * 60000 + b"\n", "header is not JSON"),
    "an unknown type": (b'{"type": "format-disk"}\n', "unknown event type 'format-disk'"),
    "an odd byte count": (
        b'{"type": "audio-chunk", "data": {"rate": 16000, "width": 2, "channels": 1}, '
        b'"payload_length": 3}\nabc',
        "not whole samples",
    ),
    "32-bit audio": (
        b'{"type": "audio-start", "data": {"rate": 16000, "width": 4, "channels": 1}}\n',
        "audio of 4 bytes a sample",
    ),
}


@pytest.mark.parametrize("bad", BAD_EVENTS, ids=list(BAD_EVENTS))
def test_a_bad_event_closes_its_connection_alone(model, bad, caplog):
    audio, _ = take("2718", "theo", 0)
    half = len(chunks(audio)) // 2
    sent, reason = BAD_EVENTS[bad]

    async def scenario(port: int) -> tuple[list[Event], int]:
        async with client(port) as good:
            await send(good, Detect().event(), AudioStart(rate=RATE, width=2, channels=1).event())
            await send(good, *chunks(audio)[:half])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            attacker = writer.get_extra_info("sockname")[1]
            writer.write(sent)
            await writer.drain()
            assert await closed(reader)
            writer.close()
            await send(good, *chunks(audio)[half:], AudioStop().event())
            return await until_pong(good), attacker

    with caplog.at_level(logging.WARNING, "fedspeech.runtime.wyoming_service"):
        events, attacker = run(model, scenario)
    assert [Detection.from_event(e).name for e in events] == list("2718")  # the other client: all its words
    assert f"closed Wyoming client 127.0.0.1:{attacker}: " in caplog.text and reason in caplog.text


def test_a_transcribe_stream_over_the_bound_is_closed(model, caplog):
    audio, _ = take("27", "theo", 0)  # 2.5 s

    async def scenario(port: int) -> bool:
        async with client(port) as connection:
            await send(connection, Transcribe().event(), AudioStart(rate=RATE, width=2, channels=1).event())
            await send(connection, *chunks(audio))
            return await client_closed(connection)

    with caplog.at_level(logging.WARNING, "fedspeech.runtime.wyoming_service"):
        assert run(model, scenario, WyomingLimits(max_transcribe_s=2.0))
    assert "a transcribe stream longer than 2 s" in caplog.text


def test_a_client_beyond_max_clients_is_refused(model, caplog):
    async def scenario(port: int) -> bool:
        async with client(port) as one, client(port) as two:
            assert await until_pong(one) == [] and await until_pong(two) == []
            async with client(port) as third:
                assert await client_closed(third)
        async with client(port) as later:  # once the two have left
            await later.write_event(Describe().event())
            event = await later.read_event()
            return event is not None and Info.is_type(event.type)

    with caplog.at_level(logging.WARNING, "fedspeech.runtime.wyoming_service"):
        assert run(model, scenario, WyomingLimits(max_clients=2))
    assert "refused Wyoming client 127.0.0.1:" in caplog.text


def test_an_idle_client_is_closed(model, caplog):
    async def scenario(port: int) -> float:
        async with client(port) as busy, client(port) as idle:
            loop = asyncio.get_running_loop()
            start = loop.time()

            async def idle_closed() -> float:
                assert await client_closed(idle)
                return loop.time() - start

            closing = asyncio.create_task(idle_closed())
            for _ in range(8):  # 1.6 s of pings, each well inside the idle timeout
                assert await until_pong(busy) == []
                await asyncio.sleep(0.2)
            assert await until_pong(busy) == []  # still served
            return await closing

    with caplog.at_level(logging.WARNING, "fedspeech.runtime.wyoming_service"):
        assert 0.4 <= run(model, scenario, WyomingLimits(idle_timeout_s=0.5)) < 1.5
    assert "idle for 0.5 s" in caplog.text


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_run_wyoming_stops_cleanly_on_a_signal(fsdd_model, stop):
    port = free_port()
    uri = f"tcp://127.0.0.1:{port}"
    code = (
        "import logging, pathlib, sys\n"
        "from fedspeech.runtime.session import load_local\n"
        "from fedspeech.runtime.wyoming_service import run_wyoming\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "run_wyoming(sys.argv[1], load_local(pathlib.Path(sys.argv[2])))\n"
        "print('stopped')\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, uri, str(fsdd_model.onnx_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: listening(port), 30, "the Wyoming service to listen")
        process.send_signal(stop)
        out, err = process.communicate(timeout=15)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert out.strip() == "stopped" and "stopped serving Wyoming" in err and "Traceback" not in err


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True
