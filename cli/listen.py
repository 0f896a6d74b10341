"""`fedspeech listen`: run the global model on a microphone or an audio file and print what it hears.

Torch-free. This module only wires the command's options to the runtime, `fedspeech.runtime`
(its `Listener`, with `audio_file`, `microphone` and `model_follower`) and turns what goes
wrong into one line for the user. Audio goes through the streaming detector frame by frame, whatever its
source:

- a file is read whole (channels mixed down to mono, other sample rates resampled), followed by one window
  of silence so that a word at its very end is still seen whole, and cut into frames, as fast as possible
  or paced at real speed;
- a microphone is opened at its own sample rate, one channel, a hop of frames a block, and resampled to
  the model's rate as it comes, by soxr as a file is (not by the sound server: PulseAudio's resampler
  takes 6 to 13 dB off the top of an 8 kHz model's band, 3.4 to 3.7 kHz).

Following a coordinator, each newly announced model is downloaded, checked and loaded in the background
and swapped in between two frames, so no audio is dropped. Only announcements signed by the coordinator's
key count: the one given (--coordinator-key), else the one the coordinator sends when the listener starts.
The newest round seen announced is kept in --state, and no older one is ever loaded. Until it has a model
the listener asks the coordinator for its latest every few seconds, over HTTP(S), and logs why it waits
(the coordinator does not answer, has announced none yet, or the broker's is signed by another key).
"""

import logging
import sys
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from fedspeech.listen_outputs import OutputConfig, Outputs, open_outputs
from fedspeech.protocol.mqtt import BrokerSettings, connect
from fedspeech.protocol.topics import DEFAULT_ROOT
from fedspeech.runtime import microphone
from fedspeech.runtime.audio_file import file_frames, read_audio
from fedspeech.runtime.listener import Listener
from fedspeech.runtime.microphone import MicrophoneError, microphone_frames
from fedspeech.runtime.model_follower import ModelFollower
from fedspeech.runtime.session import ModelError, OnnxModel, load_local
from fedspeech.runtime.streaming import Detection, DetectorConfig, StreamingDetector
from fedspeech.runtime.wyoming_service import run_wyoming

log = logging.getLogger(__name__)


class ListenError(Exception):
    """Something the user has to fix (a file, a device, an option); the text says what, in one line."""


@dataclass
class ListenConfig:
    """Where the model and the audio come from, and how to detect."""

    # a local ONNX file (with its two graphs beside it, <stem>.frontend.onnx and <stem>.classifier.onnx,
    # taken when they are there and the same model), or else:
    model: Path | None = None
    coordinator_url: str | None = None  # follow the coordinator's announced models
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    topic_root: str = DEFAULT_ROOT
    coordinator_key: str | None = None  # base64 key its announcements are signed with (None: ask it)
    coordinator_ca: Path | None = None  # the CA of an HTTPS coordinator's certificate (None: the system's)
    state_dir: Path | None = None  # where the newest round seen announced is kept (None: in memory only)
    input: Path | None = None  # an audio file, or else a microphone:
    device: str | None = None  # PortAudio device name or index (default: the default input)
    realtime: bool = False
    duration_s: float | None = None  # stop after this much audio
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    timings: bool = False
    wyoming: str | None = None  # serve Wyoming clients at tcp://HOST:PORT instead of hearing an input
    language: str = "en"  # the language a Wyoming client is told the words are in
    outputs: OutputConfig = field(default_factory=OutputConfig)


def run_listen(config: ListenConfig, out: TextIO = sys.stdout) -> list[Detection]:
    """Listen to the input (or serve Wyoming clients), print one line per detection, hand each to the
    outputs; return the detections of an input.
    """
    if (config.model is None) == (config.coordinator_url is None):
        raise ListenError("give either --model FILE or --coordinator URL")
    source: OnnxModel | ModelFollower | None = None
    try:
        outputs = open_outputs(
            config.outputs,
            config.broker,
            config.topic_root,
            lambda label: _model_of(source).spoken(label),
            following=config.coordinator_url is not None,
        )
    except ValueError as exc:
        raise ListenError(str(exc)) from None
    try:
        source = _model_source(config, outputs)
        if source is None:  # interrupted while waiting for the first model
            return []
        outputs.on_model(_model_of(source))
        if config.wyoming is not None:
            _serve(config, source, outputs, out)
            return []
        return _stream(config, source, outputs, out)
    finally:
        if isinstance(source, ModelFollower):
            source.stop()
        outputs.close(finish=config.input is not None)


def _model_source(config: ListenConfig, outputs: Outputs) -> OnnxModel | ModelFollower | None:
    """The local model, or a follower of the coordinator's that holds its first model (None if Ctrl-C
    came first); it shares the publisher's client, which it connects.
    """
    if config.model is not None:
        try:
            return load_local(config.model)
        except ModelError as exc:
            raise ListenError(str(exc)) from None
    assert config.coordinator_url is not None
    try:
        follower = ModelFollower(
            config.coordinator_url,
            config.broker,
            config.topic_root,
            config.coordinator_key,
            config.coordinator_ca,
            config.state_dir,
            client=outputs.client,
        )
        follower.start()
    except ValueError as exc:
        raise ListenError(str(exc)) from None
    if outputs.client is not None:
        connect(outputs.client, config.broker)
    if follower.wait() is None:
        follower.stop()
        return None
    return follower


def _model_of(source: OnnxModel | ModelFollower | None) -> OnnxModel:
    """The model of a source that has one."""
    model = source.model if isinstance(source, ModelFollower) else source
    assert model is not None
    return model


def _line(detection: Detection) -> str:
    """A detection as `fedspeech listen` prints it."""
    return f"{detection.time_s:9.2f} s  {detection.label}  {detection.confidence:.2f}"


def _serve(config: ListenConfig, source: OnnxModel | ModelFollower, outputs: Outputs, out: TextIO) -> None:
    """Serve the model to Wyoming clients until Ctrl-C or SIGTERM."""

    def heard(detection: Detection) -> None:
        print(_line(detection), file=out, flush=True)
        outputs.on_detection(detection, _model_of(source))

    assert config.wyoming is not None
    try:
        run_wyoming(
            config.wyoming, source, config=config.detector, language=config.language, on_detection=heard
        )
    except ValueError as exc:
        raise ListenError(str(exc)) from None


def list_devices() -> str:
    """PortAudio's audio devices, one per line, as sounddevice lists them."""
    try:
        return microphone.list_devices()
    except MicrophoneError as exc:
        raise ListenError(str(exc)) from None


def _stream(
    config: ListenConfig, model: OnnxModel | ModelFollower, outputs: Outputs, out: TextIO
) -> list[Detection]:
    """Open the audio source and feed a Listener until the source ends, the duration or Ctrl-C."""
    listener: Listener

    def heard(detection: Detection) -> None:
        print(_line(detection), file=out, flush=True)
        outputs.on_detection(detection, listener.model)

    try:
        listener = Listener(
            model,
            config=config.detector,
            on_detection=heard,
            on_model=outputs.on_model,
            timings=config.timings,
        )
    except ValueError as exc:
        raise ListenError(str(exc)) from None
    frames, source = _open_source(config, listener.detector)
    log.info("listening to %s with %s", source, listener.describe())
    max_samples = None if config.duration_s is None else config.duration_s * listener.detector.sample_rate
    detections: list[Detection] = []
    try:
        for frame in frames:
            detections += listener.feed(frame)
            if max_samples is not None and listener.detector.samples >= max_samples:
                break
    except KeyboardInterrupt:
        log.info("interrupted")
    finally:
        frames.close()  # stops a microphone
    log.info("listened to %.2f s of audio: %d detections", listener.seconds, len(detections))
    if listener.detector.timings is not None:
        print(listener.detector.timings.summary(), file=sys.stderr, flush=True)
    return detections


def _open_source(
    config: ListenConfig, detector: StreamingDetector
) -> tuple[Generator[np.ndarray, None, None], str]:
    """The frames of the input file or microphone at the model's rate, and a name for it."""
    rate, size = detector.sample_rate, detector.frame_size
    if config.input is not None:
        from fedspeech.models.clips.datasets import AudioError

        try:
            audio = read_audio(config.input, rate)
        except AudioError as exc:
            raise ListenError(str(exc)) from None
        frames = file_frames(
            audio, rate, size, detector.num_samples, config.realtime, frames_per_block=detector.hop_frames
        )
        return frames, str(config.input)
    try:
        frames = microphone_frames(config.device, rate, size, frames_per_block=detector.hop_frames)
    except MicrophoneError as exc:
        raise ListenError(str(exc)) from None
    return frames, f"input device {config.device or '(default)'}"
