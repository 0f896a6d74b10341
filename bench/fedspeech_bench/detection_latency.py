"""`fedspeech bench latency`: how long after a word is said its detection reaches whoever acts on it.

Held-out FSDD words (the listening benchmark's stream: takes no demo device trained on, 0.6 s apart) are
played at real speed, at 16 kHz in chunks of 1,024 samples (64 ms) as a Wyoming satellite sends them, into:

- the Listener itself, its on_detection callback (no transport): what the detector's decision costs;
- the Wyoming service, over TCP, to the real `wyoming` client library that Home Assistant uses;
- the MQTT publisher, through the broker, to a subscriber of the listener's detection topic.

A word's latency runs from the end of its speech in the input (the last 10 ms frame louder than a twentieth
of its loudest, as the played audio says it, at the wall-clock time that sample was played) to its event
arriving at the client. Only detections of the word said count, each matched to the word whose end is
nearest its stream time. The detector decides a word once the window's centre has left its speech: the
gate's hangover and half a window after it ends, which every path pays.
"""

import argparse
import asyncio
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fedspeech.models.clips.augment import spoken_extents
from fedspeech.protocol.mqtt import BrokerSettings, connect, make_client
from fedspeech.protocol.topics import Topics
from fedspeech.runtime.detection_events import DetectionPublisher, publisher_will
from fedspeech.runtime.listener import Listener
from fedspeech.runtime.session import load_local
from fedspeech.runtime.streaming import Detection
from fedspeech_bench.demo_defaults import DEMO_MODEL
from fedspeech_bench.listen_streams import build_stream

RATE, CHUNK = 16000, 1024  # a satellite's audio: 16 kHz, 1,024 samples a chunk
SPOKEN_THRESHOLD = 0.05  # a 10 ms frame is speech above this fraction of the word's loudest frame's RMS
MATCH_S = 0.5  # a detection belongs to the word whose end is nearest its stream time, within this


@dataclass(frozen=True)
class Said:
    """The words played, each with the stream time of the end of its speech."""

    audio: np.ndarray  # int16 at RATE
    labels: list[str]
    ends_s: list[float]


@dataclass
class PathLatency:
    """One path's latencies, in ms, of the words heard right."""

    path: str
    words: int
    heard: int
    latencies_ms: list[float]
    heard_words: list[int]  # the index of the word each latency is of

    def row(self, direct: "PathLatency") -> str:
        """Its row of the markdown table; what it adds to direct, the in-process path, word by word."""
        values = sorted(self.latencies_ms)
        median = statistics.median(values) if values else float("nan")
        p95 = values[min(len(values) - 1, int(np.ceil(0.95 * len(values))) - 1)] if values else float("nan")
        worst = values[-1] if values else float("nan")
        theirs = dict(zip(direct.heard_words, direct.latencies_ms, strict=True))
        added = [
            ms - theirs[word]
            for word, ms in zip(self.heard_words, self.latencies_ms, strict=True)
            if word in theirs
        ]
        more = f"{statistics.median(added):.1f}" if added else "-"
        heard = f"{self.heard} of {self.words}"
        return f"| {self.path} | {heard} | {median:.0f} | {p95:.0f} | {worst:.0f} | {more} |"


def said_words(model_rate: int, words: int, seed: int) -> Said:
    """The held-out stream at RATE as int16, its labels and the ends of their speech."""
    from fedspeech_bench.listen_bench import fsdd_heard

    heard = fsdd_heard()
    stream = build_stream(heard.clips, heard.labels, model_rate, 0.6, seed, words)
    frame = model_rate // 100
    ends = []
    for word in stream.words:
        _, end = spoken_extents(stream.audio[None, word.start : word.end], frame, SPOKEN_THRESHOLD)
        ends.append((word.start + int(end[0])) / model_rate)
    import soxr

    audio = soxr.resample(np.concatenate([stream.audio, np.zeros(model_rate, np.float32)]), model_rate, RATE)
    pcm = np.round(np.clip(audio, -1, 1) * 32767).astype(np.int16)
    return Said(pcm, [word.label for word in stream.words], ends)


def latencies(said: Said, path: str, arrivals: list[tuple[str, float, float]], start: float) -> PathLatency:
    """A path's latencies from (label, stream time, arrival monotonic time) of its detections."""
    ends = np.array(said.ends_s)
    found: dict[int, float] = {}
    for label, stream_s, arrived in arrivals:
        word = int(np.argmin(np.abs(ends - stream_s)))
        if abs(ends[word] - stream_s) <= MATCH_S and said.labels[word] == label and word not in found:
            found[word] = 1000 * (arrived - (start + ends[word]))
    heard = sorted(found)
    return PathLatency(path, len(said.labels), len(found), [found[word] for word in heard], heard)


def play(said: Said, send: Callable[[np.ndarray], object]) -> float:
    """Send the audio in chunks at real speed (a chunk once its last sample is said); the start time."""
    start = time.monotonic()
    for i in range(0, len(said.audio), CHUNK):
        time.sleep(max(0.0, start + (i + CHUNK) / RATE - time.monotonic()))
        send(said.audio[i : i + CHUNK])
    return start


def in_process(model_path: Path, said: Said) -> PathLatency:
    """Latency to the Listener's own callback."""
    arrivals: list[tuple[str, float, float]] = []
    listener = Listener(
        model_path,
        RATE,
        on_detection=lambda d: arrivals.append((d.label, d.time_s, time.monotonic())),
    )
    start = play(said, listener.feed)
    return latencies(said, "in process", arrivals, start)


def over_wyoming(model_path: Path, said: Said, port: int) -> PathLatency:
    """Latency to a wyoming client of the service, over TCP."""
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.wake import Detect
    from wyoming.wake import Detection as WakeDetection

    from fedspeech.runtime.wyoming_service import serve

    async def run() -> tuple[float, list[tuple[str, float, float]]]:
        ready = asyncio.Event()
        server = asyncio.create_task(serve(f"tcp://127.0.0.1:{port}", load_local(model_path), ready=ready))
        await ready.wait()
        arrivals: list[tuple[str, float, float]] = []
        async with AsyncTcpClient("127.0.0.1", port) as client:

            async def receive() -> None:
                while (event := await client.read_event()) is not None:
                    if WakeDetection.is_type(event.type):
                        wake = WakeDetection.from_event(event)
                        arrivals.append((wake.name or "", (wake.timestamp or 0) / 1000, time.monotonic()))
                    else:
                        return  # not-detected: the stream is over

            receiver = asyncio.create_task(receive())
            await client.write_event(Detect().event())
            await client.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
            start = time.monotonic()
            for i in range(0, len(said.audio), CHUNK):
                await asyncio.sleep(max(0.0, start + (i + CHUNK) / RATE - time.monotonic()))
                chunk = AudioChunk(rate=RATE, width=2, channels=1, audio=said.audio[i : i + CHUNK].tobytes())
                await client.write_event(chunk.event())
            await asyncio.sleep(0.5)
            receiver.cancel()
            await client.write_event(AudioStop().event())
        server.cancel()
        return start, arrivals

    start, arrivals = asyncio.run(run())
    return latencies(said, "Wyoming", arrivals, start)


def over_mqtt(model_path: Path, said: Said, broker: BrokerSettings) -> PathLatency:
    """Latency to a subscriber of the listener's detection topic, through the broker."""
    topics, name = Topics(f"fedspeech-bench/latency-{int(time.time())}"), "bench-listen"
    arrivals: list[tuple[str, float, float]] = []
    subscribed = threading.Event()

    def on_message(client: object, userdata: object, message: object) -> None:
        event = json.loads(message.payload)  # type: ignore[attr-defined]
        arrivals.append((event["label"], event["stream_time_s"], time.monotonic()))

    subscriber = make_client(broker, f"bench-subscriber-{int(time.time())}")
    subscriber.on_message = on_message
    subscriber.on_subscribe = lambda *args: subscribed.set()
    subscriber.on_connect = lambda client, *args: client.subscribe(topics.detections(name), qos=1)
    connect(subscriber, broker)
    client = make_client(broker, name, publisher_will(name, topics))
    publisher = DetectionPublisher(client, name, topics, discovery_prefix=None)
    publisher.attach()
    connect(client, broker)
    subscribed.wait(10)
    time.sleep(0.5)  # the publisher connected too
    on_detection: Callable[[Detection], None] = publisher.on_detection
    listener = Listener(model_path, RATE, on_detection=on_detection)
    start = play(said, listener.feed)
    time.sleep(0.5)
    publisher.close()
    for mqtt_client in (client, subscriber):
        mqtt_client.disconnect()
        mqtt_client.loop_stop()
    return latencies(said, "MQTT", arrivals, start)


def run(model_path: Path, words: int, seed: int, broker: BrokerSettings, port: int, out: Path) -> str:
    """Measure the three paths on one stream; write the table, the plot and the figures; the table."""
    said = said_words(load_local(model_path).sample_rate, words, seed)
    results = [
        in_process(model_path, said),
        over_wyoming(model_path, said, port),
        over_mqtt(model_path, said, broker),
    ]
    table = "\n".join(
        [
            f"Latency from the end of a spoken word to its event at the client ({words} held-out words, "
            f"real speed, 16 kHz chunks of {CHUNK}), ms:",
            "",
            "| path | heard right | median | p95 | max | added to in process, median |",
            "|---|---|---|---|---|---|",
            *(result.row(results[0]) for result in results),
        ]
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "latency.md").write_text(table + "\n")
    (out / "latency.json").write_text(json.dumps([asdict(result) for result in results], indent=1))
    _plot(results, out / "latency.png")
    return table


def _plot(results: list[PathLatency], path: Path) -> None:
    """The share of words heard within each latency, one line per path."""
    from fedspeech_bench.report.plots import pyplot

    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6, 3.5))
    for result in results:
        values = np.sort(result.latencies_ms)
        axes.step(
            values, np.arange(1, len(values) + 1) / max(1, len(values)), where="post", label=result.path
        )
    axes.set_xlabel("ms from the end of the word to its event")
    axes.set_ylabel("share of words heard")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `bench latency` and its options to the `bench` subcommands."""
    p = bench_subparsers.add_parser(
        "latency", help="from the end of a spoken word to its event: in process, over Wyoming and over MQTT"
    )
    p.add_argument("--model", type=Path, default=DEMO_MODEL, help=f"an exported model (default {DEMO_MODEL})")
    p.add_argument("--words", type=int, default=40, help="held-out words played at real speed (default 40)")
    p.add_argument("--seed", type=int, default=0, help="which words, in which order (default 0)")
    p.add_argument("--broker", default="mqtt://127.0.0.1:1883", help="an MQTT broker to publish through")
    p.add_argument(
        "--port", type=int, default=10499, help="a free port for the Wyoming service (default 10499)"
    )
    p.add_argument("--out", type=Path, default=Path("fedspeech-bench-latency"), help="where results go")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> None:
    print(run(args.model, args.words, args.seed, BrokerSettings(args.broker), args.port, args.out))
