"""A Wyoming protocol service (Home Assistant's voice protocol) on fedspeech's detections.

`fedspeech listen --wyoming tcp://HOST:PORT` serves one model (a file, or the coordinator's newest through
a ModelFollower, hot-swapped between frames) to many clients at once, each connection with a Listener of
its own (its own detector state):

- `describe` -> `info`: a wake program "fedspeech" whose models are the current model's words (name: the
  label, phrase: its spoken form), and an ASR program "fedspeech" with one model, the task's.
- wake word: `detect` (names: the labels to report, none: all), then `audio-start`, `audio-chunk`s and
  `audio-stop`; a `detection` (name: the label, timestamp: the milliseconds of stream time since
  audio-start at the end of the word) as soon as each word is heard, and `not-detected` at audio-stop if
  none was. Audio is heard for wake words unless a `transcribe` came before its stream, and a stream may
  start with a chunk, without audio-start (wyoming-satellite streams its microphone to a wake service
  after `detect` alone): the chunk's format opens it.
- speech to text: `transcribe`, then the audio; at audio-stop one `transcript` whose text is the spoken
  forms of the words heard, joined by spaces (empty if none).

Audio is 16-bit PCM (width 2), any rate and number of channels: the Listener mixes the channels down and
resamples to the model's rate. Events are read by `read_event`, bounded (WyomingLimits): the header line,
its data part and its payload are checked before they are read, as wyoming's own reader does not. An
event that breaks the protocol or a bound, or a client silent for the idle timeout, closes that
connection alone, logged with the client's address; a client beyond max_clients is closed at once.
Inference runs in the event loop (a window costs well under a millisecond); a new detector, which loads
the Silero VAD, is made on a worker thread.
"""

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

import numpy as np
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event, async_write_event
from wyoming.info import AsrModel, AsrProgram, Attribution, Describe, Info, WakeModel, WakeProgram
from wyoming.ping import Ping, Pong
from wyoming.wake import Detect, NotDetected
from wyoming.wake import Detection as WakeDetection

from fedspeech.protocol import onnx_metadata as meta
from fedspeech.runtime.listener import Listener
from fedspeech.runtime.model_follower import ModelFollower
from fedspeech.runtime.session import OnnxModel
from fedspeech.runtime.streaming import Detection, DetectorConfig, model_round
from fedspeech.runtime.version import fedspeech_version
from fedspeech.runtime.wyoming_events import (
    SAMPLE_WIDTH,
    WyomingError,
    WyomingLimits,
    audio_format,
    read_event,
    shown,
)

log = logging.getLogger(__name__)

PROGRAM = "fedspeech"
ATTRIBUTION = Attribution(name="fedspeech", url="")
MODEL_WAIT_S = 0.5  # between two looks at a follower that has no model yet
CLOSE_S = 5.0  # at most, waiting at the stop for the connections to close


async def serve(
    uri: str,
    model: OnnxModel | ModelFollower,
    *,
    config: DetectorConfig | None = None,
    limits: WyomingLimits | None = None,
    language: str = "en",
    on_detection: Callable[[Detection], None] | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve model's detections over Wyoming at uri (tcp://HOST:PORT) until cancelled; ValueError for a
    uri or a config that cannot work. A follower's first model is waited for before listening.

    on_detection hears every word any client's stream detects; ready is set once clients can connect.
    """
    limits = limits or WyomingLimits()
    host, port = _tcp_address(uri)
    if _current(model) is None:
        log.info("waiting for the coordinator's first model before serving Wyoming")
    while _current(model) is None:
        await asyncio.sleep(MODEL_WAIT_S)
    first = _current(model)
    assert first is not None
    Listener(first, config=config)  # a config the model cannot run with fails here, not in each client
    clients: set[asyncio.Task[None]] = set()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(clients) >= limits.max_clients:
            log.warning("refused Wyoming client %s: %d clients already", _peer(writer), len(clients))
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        clients.add(task)
        try:
            session = WyomingSession(model, config, limits, language, on_detection)
            await _converse(reader, writer, session, limits)
        except asyncio.CancelledError:
            pass  # the service stopping; Python 3.11's asyncio logs a cancelled connection task as an error
        finally:
            clients.discard(task)

    server = await asyncio.start_server(connected, host, port, limit=limits.max_header_bytes)
    log.info("serving Wyoming on %s: %s, words %s", uri, first.describe(), first.words)
    try:
        if ready is not None:
            ready.set()
        await server.serve_forever()
    finally:
        server.close()
        for task in list(clients):
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        with contextlib.suppress(TimeoutError):  # a connection not yet detached must not hold the stop
            await asyncio.wait_for(server.wait_closed(), CLOSE_S)
        log.info("stopped serving Wyoming on %s", uri)


def run_wyoming(
    uri: str,
    model: OnnxModel | ModelFollower,
    *,
    config: DetectorConfig | None = None,
    limits: WyomingLimits | None = None,
    language: str = "en",
    on_detection: Callable[[Detection], None] | None = None,
) -> None:
    """Serve as `serve` does until Ctrl-C or SIGTERM; ValueError for a uri or config that cannot work."""

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        for stop in (signal.SIGINT, signal.SIGTERM):  # handled in the loop: serve is cancelled, cleans up
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
                asyncio.get_running_loop().add_signal_handler(stop, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(
                uri, model, config=config, limits=limits, language=language, on_detection=on_detection
            )

    with contextlib.suppress(KeyboardInterrupt):  # asyncio.run has cancelled serve, which cleaned up
        asyncio.run(main())


def wyoming_info(model: OnnxModel, language: str = "en") -> Info:
    """The info answering describe: a wake program of model's words and an ASR program of its task."""
    version = _version(model)
    words = [
        WakeModel(
            name=label,
            attribution=ATTRIBUTION,
            installed=True,
            description=model.spoken(label),
            version=version,
            languages=[language],
            phrase=model.spoken(label),
        )
        for label in model.words
    ]
    task = AsrModel(
        name=_task_name(model),
        attribution=ATTRIBUTION,
        installed=True,
        description=f"{model.describe()}: {', '.join(map(model.spoken, model.words))}",
        version=version,
        languages=[language],
    )
    release = fedspeech_version()
    wake = WakeProgram(
        name=PROGRAM,
        attribution=ATTRIBUTION,
        installed=True,
        description="fedspeech word detection",
        version=release,
        models=words,
    )
    asr = AsrProgram(
        name=PROGRAM,
        attribution=ATTRIBUTION,
        installed=True,
        description="fedspeech command words",
        version=release,
        models=[task],
    )
    return Info(wake=[wake], asr=[asr])


@dataclass
class _Stream:
    """An audio stream open on a connection: its format, what it is heard for, what it has detected."""

    rate: int
    channels: int
    transcribe: Transcribe | None  # None: heard for wake words
    detected: int = 0  # detection events sent
    words: list[str] | None = None  # a transcribe stream's words, spoken


class WyomingSession:
    """One client's conversation, without the network: `handle` takes its events and returns the events
    to answer with, in order; WyomingError for one that breaks the protocol or a bound.
    """

    def __init__(
        self,
        model: OnnxModel | ModelFollower,
        config: DetectorConfig | None = None,
        limits: WyomingLimits | None = None,
        language: str = "en",
        on_detection: Callable[[Detection], None] | None = None,
    ) -> None:
        self._source, self._config = model, config
        self._limits, self._language = limits or WyomingLimits(), language
        self._on_detection = on_detection
        self._listener: Listener | None = None
        self._stream: _Stream | None = None
        self._detect = Detect()  # the last detect: its names filter the wake words reported
        self._transcribe: Transcribe | None = None  # a transcribe waiting for its stream

    async def handle(self, event: Event) -> list[Event]:
        """The events answering event."""
        kind = event.type
        if Describe.is_type(kind):
            current = _current(self._source)
            return [] if current is None else [wyoming_info(current, self._language).event()]
        if Detect.is_type(kind):
            self._detect = Detect.from_event(event)
            self._transcribe = None
            return []
        if Transcribe.is_type(kind):
            self._transcribe = Transcribe.from_event(event)
            return []
        if AudioStart.is_type(kind):
            await self._start(*audio_format(event))
            return []
        if AudioChunk.is_type(kind):
            return await self._chunk(event)
        if AudioStop.is_type(kind):
            return await self._stop()
        if Ping.is_type(kind):
            return [Pong(text=Ping.from_event(event).text).event()]
        if kind == "select-program":  # a newer client's choice among programs: there is one of each
            return []
        raise WyomingError(f"unknown event type {shown(kind)}")

    async def _start(self, rate: int, channels: int) -> None:
        """Open a stream (dropping one left open): a fresh detector, its clock at 0, on the newest model."""
        # a new Listener (or reset) loads the Silero VAD: tens of ms, kept off the event loop
        if self._listener is None:
            self._listener = await asyncio.to_thread(
                Listener, self._source, rate, config=self._config, on_detection=self._hook
            )
        else:
            await asyncio.to_thread(self._listener.reset, rate)
        words: list[str] | None = None if self._transcribe is None else []
        self._stream = _Stream(rate, channels, self._transcribe, words=words)

    async def _chunk(self, event: Event) -> list[Event]:
        """Hear a chunk (opening a stream in its format if none is open); the detections it completes."""
        rate, channels = audio_format(event)
        audio = event.payload or b""
        if len(audio) % (SAMPLE_WIDTH * channels):
            raise WyomingError(f"an audio chunk of {len(audio)} bytes is not whole samples of {channels}")
        if self._stream is None:
            await self._start(rate, channels)
        stream, listener = self._stream, self._listener
        assert stream is not None and listener is not None
        if (rate, channels) != (stream.rate, stream.channels):
            raise WyomingError(
                f"an audio chunk at {rate} Hz, {channels} channels in a stream at "
                f"{stream.rate} Hz, {stream.channels} channels"
            )
        samples = np.frombuffer(audio, dtype="<i2")
        detections = listener.feed(samples.reshape(-1, channels) if channels > 1 else samples)
        if stream.transcribe is not None and listener.seconds > self._limits.max_transcribe_s:
            raise WyomingError(f"a transcribe stream longer than {self._limits.max_transcribe_s:g} s")
        return self._heard(stream, listener, detections)

    async def _stop(self) -> list[Event]:
        """End the stream: its last word decided; then not-detected, or the transcript."""
        stream, listener, pending = self._stream, self._listener, self._transcribe
        self._stream, self._transcribe = None, None
        if stream is None:  # a stop with no audio before it: an empty stream
            stream = _Stream(0, 1, pending, words=None if pending is None else [])
            answers = []
        else:
            assert listener is not None
            answers = self._heard(stream, listener, listener.flush())
        if stream.transcribe is not None:
            text = " ".join(stream.words or [])
            log.debug("transcribed %r", text)
            transcript = Transcript(text=text, language=self._language, context=stream.transcribe.context)
            return answers + [transcript.event()]
        if not stream.detected:
            answers.append(NotDetected(context=self._detect.context).event())
        return answers

    def _hook(self, detection: Detection) -> None:
        """Give a detection to on_detection; a failing hook is logged, the stream goes on."""
        if self._on_detection is None:
            return
        try:
            self._on_detection(detection)
        except Exception:
            log.exception("the detection hook failed on %s", detection)

    def _heard(self, stream: _Stream, listener: Listener, detections: list[Detection]) -> list[Event]:
        """The events for a stream's detections: wake detections (those asked for), or words kept."""
        answers = []
        for detection in detections:
            if stream.words is not None:
                stream.words.append(listener.model.spoken(detection.label))
            elif self._detect.names is None or detection.label in self._detect.names:
                stream.detected += 1
                timestamp = round(detection.time_s * 1000)
                wake = WakeDetection(name=detection.label, timestamp=timestamp, context=self._detect.context)
                answers.append(wake.event())
        return answers


async def _converse(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session: WyomingSession, limits: WyomingLimits
) -> None:
    """Answer a client's events until it leaves, breaks the protocol or is idle for too long."""
    peer = _peer(writer)
    log.info("Wyoming client %s connected", peer)
    try:
        while True:
            # the client sending nothing, or not reading what it is sent, counts as idle
            async with asyncio.timeout(limits.idle_timeout_s):
                event = await read_event(reader, limits)
                if event is None:
                    log.info("Wyoming client %s left", peer)
                    return
                for answer in await session.handle(event):
                    await async_write_event(answer, writer)
    except TimeoutError:
        log.warning("closed Wyoming client %s: idle for %g s", peer, limits.idle_timeout_s)
    except WyomingError as exc:
        log.warning("closed Wyoming client %s: %s", peer, exc)
    except ConnectionError as exc:
        log.info("lost Wyoming client %s: %s", peer, exc)
    except Exception:  # a fault of this service with one client must not stop it serving the others
        log.exception("closed Wyoming client %s on an unexpected error", peer)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _current(model: OnnxModel | ModelFollower) -> OnnxModel | None:
    """The model listening now: the one given, or the follower's newest (None before its first)."""
    return model.model if isinstance(model, ModelFollower) else model


def _version(model: OnnxModel) -> str | None:
    """A model's version: its round, None for a model exported outside the rounds."""
    number = model_round(model)
    return None if number is None else str(number)


def _task_name(model: OnnxModel) -> str:
    """The ASR model's name: the task the model learnt, else its architecture."""
    metadata = model.metadata
    return metadata.get(meta.TASK) or metadata.get(meta.MODEL) or PROGRAM


def _tcp_address(uri: str) -> tuple[str, int]:
    """The host and port of tcp://HOST:PORT; ValueError for another uri."""
    parsed = urlparse(uri)
    port = parsed.port  # ValueError for a port that is not one
    if parsed.scheme != "tcp" or not parsed.hostname or port is None:
        raise ValueError(f"a Wyoming service listens on tcp://HOST:PORT, not {uri!r}")
    return parsed.hostname, port


def _peer(writer: asyncio.StreamWriter) -> str:
    """The client's address, host:port."""
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
