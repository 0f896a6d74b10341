"""`fedspeech listen`: run the global model on a microphone or an audio file and print what it hears.

Torch-free: numpy, onnxruntime, soundfile/soxr for files, sounddevice (PortAudio) for microphones and
paho-mqtt when following a coordinator. Audio goes through `StreamingDetector` frame by frame, whatever
its source:

- a file is read whole (channels mixed down to mono, other sample rates resampled with soxr), followed by
  one window of silence so that a word at its very end is still seen whole, and cut into frames, as fast as
  possible or paced at real speed;
- a microphone is opened at the model's sample rate, one channel, with a block size of one frame; the
  PortAudio callback only copies each block into a queue, and this thread feeds the detector from it.

Following a coordinator, a paho-mqtt client subscribes to the retained model announcement; on its network
thread each new ONNX model is downloaded, checked against the announced sha256 and loaded, then handed over
to this thread, which swaps it in between two frames, so no audio is dropped. A model that cannot be
downloaded, does not match its digest or does not load is logged and the current one kept.
"""

import http.client
import logging
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from fedspeech.edge_client import microphone
from fedspeech.edge_client.microphone import MicrophoneError, microphone_frames
from fedspeech.export.runtime import OnnxModel
from fedspeech.export.streaming import Detection, DetectorConfig, StreamingDetector
from fedspeech.protocol import messages, weights
from fedspeech.protocol.messages import ModelAnnouncement
from fedspeech.protocol.topics import DEFAULT_ROOT, Topics, parse_broker_url

log = logging.getLogger(__name__)

HTTP_TIMEOUT = 30.0


class ListenError(Exception):
    """Something the user has to fix (a file, a device, an option); the text says what, in one line."""


@dataclass
class ListenConfig:
    """Where the model and the audio come from, and how to detect."""

    model: Path | None = None  # a local ONNX file, or else:
    coordinator_url: str | None = None  # follow the coordinator's announced models
    broker_url: str = "mqtt://127.0.0.1:1883"
    topic_root: str = DEFAULT_ROOT
    input: Path | None = None  # an audio file, or else a microphone:
    device: str | None = None  # PortAudio device name or index (default: the default input)
    realtime: bool = False
    duration_s: float | None = None  # stop after this much audio
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    timings: bool = False


def run_listen(config: ListenConfig, out: TextIO = sys.stdout) -> list[Detection]:
    """Stream the input through the detector, print one line per detection and return the detections."""
    if (config.model is None) == (config.coordinator_url is None):
        raise ListenError("give either --model FILE or --coordinator URL")
    if config.model is not None:
        return _stream(config, load_model(config.model), None, out)
    follower = ModelFollower(config.coordinator_url, config.broker_url, config.topic_root)
    follower.start()
    try:
        model = follower.wait()
        return [] if model is None else _stream(config, model, follower, out)
    finally:
        follower.stop()


def _stream(
    config: ListenConfig, model: OnnxModel, follower: "ModelFollower | None", out: TextIO
) -> list[Detection]:
    """Open the audio source and feed the detector until the source ends, the duration or Ctrl-C."""
    try:
        detector = StreamingDetector(model, config.detector, timings=config.timings)
    except ValueError as exc:
        raise ListenError(str(exc)) from None
    if config.input is not None:
        audio = read_audio(config.input, model.sample_rate)
        rate, size = model.sample_rate, detector.frame_size
        frames = file_frames(audio, rate, size, silence_after=model.num_samples, realtime=config.realtime)
        source = str(config.input)
    else:
        try:
            frames = microphone_frames(config.device, model.sample_rate, detector.frame_size)
        except MicrophoneError as exc:
            raise ListenError(str(exc)) from None
        source = f"input device {config.device or '(default)'}"
    log.info(
        "listening to %s with %s: a window of %d samples classified every %d frames of %d",
        source,
        describe(model),
        detector.num_samples,
        detector.hop_frames,
        detector.frame_size,
    )
    max_samples = None if config.duration_s is None else config.duration_s * model.sample_rate
    detections: list[Detection] = []
    try:
        for frame in frames:
            if follower is not None:
                _take_new_model(follower, detector)
            detection = detector.push(frame)
            if detection is not None:
                detections.append(detection)
                line = f"{detection.time_s:9.2f} s  {detection.label}  {detection.confidence:.2f}"
                print(line, file=out, flush=True)
            if max_samples is not None and detector.samples >= max_samples:
                break
    except KeyboardInterrupt:
        log.info("interrupted")
    finally:
        frames.close()  # stops a microphone stream
    seconds = detector.samples / detector.sample_rate
    log.info("listened to %.2f s of audio: %d detections", seconds, len(detections))
    if detector.timings is not None:
        print(detector.timings.summary(), file=sys.stderr, flush=True)
    return detections


def _take_new_model(follower: "ModelFollower", detector: StreamingDetector) -> None:
    """Swap in the follower's newest model, if it has one, between two frames."""
    model = follower.take()
    if model is None:
        return
    try:
        detector.swap(model)
    except ValueError as exc:
        log.error("keeping %s: %s", describe(detector.model), exc)
        return
    log.info("swapped in %s at %.2f s of audio", describe(model), detector.samples / detector.sample_rate)


def describe(model: OnnxModel) -> str:
    """A short name for a model, e.g. 'model cnn round 3'."""
    metadata = model.metadata
    return f"model {metadata.get('model', '?')} round {metadata.get('round', '?')}"


def load_model(source: Path | bytes, name: str | None = None) -> OnnxModel:
    """Load an ONNX file or bytes as an OnnxModel; ListenError with the reason if it is not one."""
    name = name or str(source)
    if isinstance(source, Path) and not source.is_file():
        raise ListenError(f"{name}: no such model file")
    try:
        return OnnxModel(source)
    except Exception as exc:  # onnxruntime's own errors (InvalidProtobuf, ...) derive only from Exception
        reason = " ".join(str(exc).split())
        raise ListenError(f"{name}: not a usable fedspeech ONNX model ({reason})") from None


# ---- audio sources ----


def read_audio(path: Path, sample_rate: int) -> np.ndarray:
    """A whole audio file as float32 mono at sample_rate: channels mixed down, other rates resampled."""
    import soundfile

    from fedspeech.models.datasets import AudioError, load_audio

    # load_audio checks and decodes the file as training does; asked for the file's own length at
    # sample_rate, it neither crops nor pads
    try:
        info = soundfile.info(str(path))
        length = max(1, round(info.frames * sample_rate / info.samplerate))
    except (RuntimeError, TypeError, OSError):
        length = 1  # unreadable: load_audio says why
    try:
        return load_audio(path, sample_rate, length)
    except AudioError as exc:
        raise ListenError(str(exc)) from None


def file_frames(
    audio: np.ndarray, sample_rate: int, frame_size: int, silence_after: int = 0, realtime: bool = False
) -> Iterator[np.ndarray]:
    """Frames of audio followed by silence_after zero samples, paced at real speed if realtime."""
    padding = silence_after + (-(len(audio) + silence_after)) % frame_size  # whole frames only
    audio = np.concatenate([audio, np.zeros(padding, dtype=np.float32)])
    start = time.monotonic()
    for i in range(0, len(audio), frame_size):
        if realtime:  # a frame is there once its last sample has been spoken
            time.sleep(max(0.0, start + (i + frame_size) / sample_rate - time.monotonic()))
        yield audio[i : i + frame_size]


def list_devices() -> str:
    """PortAudio's audio devices, one per line, as sounddevice lists them."""
    try:
        return microphone.list_devices()
    except MicrophoneError as exc:
        raise ListenError(str(exc)) from None


# ---- following the coordinator ----


class ModelFollower:
    """Follows the coordinator's retained model announcement and loads each new ONNX model it announces."""

    def __init__(self, coordinator_url: str, broker_url: str, topic_root: str = DEFAULT_ROOT):
        try:
            self._broker = parse_broker_url(broker_url)
        except ValueError as exc:
            raise ListenError(str(exc)) from None
        self.coordinator_url = coordinator_url.rstrip("/")
        self.broker_url = broker_url
        self.topic = Topics(topic_root).model
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._pending: OnnxModel | None = None
        self._digest: str | None = None  # of the newest model loaded
        self._client: Any = None

    def start(self) -> None:
        """Connect to the broker (reconnecting by itself) and subscribe to the model announcement."""
        import paho.mqtt.client as mqtt

        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        client.reconnect_delay_set(min_delay=1, max_delay=30)

        def on_connect(client, userdata, flags, reason_code, properties) -> None:
            if reason_code.is_failure:
                log.warning("broker %s refused the connection: %s", self.broker_url, reason_code)
                return
            log.info("connected to broker %s, following %s", self.broker_url, self.topic)
            client.subscribe(self.topic, qos=1)

        client.on_connect = on_connect
        client.message_callback_add(self.topic, lambda client, userdata, msg: self._on_model(msg.payload))
        client.connect_async(*self._broker)
        client.loop_start()
        self._client = client

    def stop(self) -> None:
        """Disconnect from the broker."""
        if self._client is not None:
            self._client.disconnect()
            self._client.loop_stop()

    def take(self) -> OnnxModel | None:
        """The newest model loaded since the last call, or None."""
        if not self._ready.is_set():
            return None
        with self._lock:
            model, self._pending = self._pending, None
            self._ready.clear()
        return model

    def wait(self) -> OnnxModel | None:
        """Block until a model is loaded and return it; None if interrupted first."""
        log.info("waiting for a model announcement on %s at %s", self.topic, self.broker_url)
        try:
            while not self._ready.wait(0.5):
                pass
        except KeyboardInterrupt:
            return None
        return self.take()

    def _on_model(self, payload: bytes) -> None:
        """Download, check and load an announced model (on the MQTT thread); log and drop a bad one."""
        if not payload:
            return  # the retained announcement was cleared
        try:
            announcement = messages.decode(payload, ModelAnnouncement)
        except messages.ProtocolError as exc:
            log.warning("dropping malformed model announcement: %s", exc)
            return
        ref = announcement.onnx
        if ref is None:
            log.warning("round %d: ignoring it, it has no ONNX model", announcement.round)
            return
        if ref.sha256 == self._digest:
            return  # the retained announcement again, after a reconnect
        url = self.coordinator_url + ref.path
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as reply:
                data = reply.read()
            weights.check_digest(data, ref.sha256)
            model = load_model(data, url)
        except (OSError, ValueError, http.client.HTTPException, weights.WeightsError, ListenError) as exc:
            log.warning("round %d: ignoring its model: %s", announcement.round, exc)
            return
        log.info("downloaded %s (%d bytes) from %s", describe(model), len(data), url)
        with self._lock:
            self._pending = model
            self._digest = ref.sha256
            self._ready.set()
