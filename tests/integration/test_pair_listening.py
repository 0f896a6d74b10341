"""A model as two graphs on real FSDD streams: the same probabilities and detections as its one file, its
front-end run on new frames only; a local pair taken only when it is the file's; a listener following a
coordinator takes the pair it announces, and still follows an announcement without one.
"""

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile

from fedspeech.protocol import onnx_metadata as meta
from fedspeech.protocol.messages import ModelAnnouncement
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.runtime import model_follower
from fedspeech.runtime.model_follower import ModelFollower
from fedspeech.runtime.session import OnnxModel, PairedModel, load_local
from fedspeech.runtime.streaming import Detection, DetectorConfig, StreamingDetector
from fedspeech.runtime.windows import FeatureWindows, WaveformWindows
from tests.helpers.coordinators import running_coordinator
from tests.helpers.onnx_files import with_metadata
from tests.helpers.ports import free_port
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.timeout(300)

RECORDINGS = Path(__file__).resolve().parents[2] / "data" / "fsdd" / "recordings"
RATE, FRAME = 8000, 80
SETTINGS = {"eval_corpus": None, "eval_every": 0, "min_devices": 1, "rounds": 1}  # no device ever comes


def stream(speakers: list[tuple[str, int]], pause_s: float = 0.6) -> np.ndarray:
    """Speakers' held-out takes of 0 to 9 in a row, pause_s apart, and a window of silence to end."""
    pause = np.zeros(round(pause_s * RATE), np.float32)
    parts = [pause]
    for speaker, number in speakers:
        for digit in range(10):
            clip, rate = soundfile.read(RECORDINGS / f"{digit}_{speaker}_{number}.flac", dtype="float32")
            assert rate == RATE
            parts += [clip, pause]
    return np.concatenate(parts + [np.zeros(RATE, np.float32)])


class Spy:
    """Stands in for a window source's classify: the same probabilities, each kept."""

    def __init__(self, classify, seen: list[np.ndarray]):
        self.classify, self.seen = classify, seen

    def __call__(self, window: np.ndarray) -> np.ndarray:
        probabilities = self.classify(window)
        self.seen.append(probabilities[0].copy())
        return probabilities


def run(detector: StreamingDetector, audio: np.ndarray, swaps: dict[int, OnnxModel] | None = None):
    """The detections of audio pushed frame by frame, and the probabilities of every classified window;
    swaps: models swapped in before the frame of their number.
    """
    seen: list[np.ndarray] = []
    detections: list[Detection] = []
    for n, frame in enumerate(audio[: len(audio) // FRAME * FRAME].reshape(-1, FRAME)):
        if swaps and n in swaps:
            detector.swap(swaps[n])
        windows = detector._windows  # the seam, spied on for each window's probabilities
        if not isinstance(windows.classify, Spy):
            windows.classify = Spy(windows.classify, seen)  # type: ignore[method-assign]
        detection = detector.push(frame)
        if detection is not None:
            detections.append(detection)
    return detections, np.array(seen)


@pytest.fixture(scope="module")
def pair(fsdd_model) -> PairedModel:
    """The session's model as the two graphs exported beside its one file."""
    model = load_local(fsdd_model.onnx_path)
    assert isinstance(model, PairedModel), "export_onnx(pair=True) wrote both beside the file"
    return model


@pytest.mark.parametrize("voice", [True, False], ids=["vad", "energy gate"])
def test_the_pair_gives_every_window_of_a_real_stream_the_one_files_probabilities(fsdd_model, pair, voice):
    audio = stream([("lucas", 1), ("george", 3), ("theo", 0)])
    config = DetectorConfig(voice=voice)
    one_file = StreamingDetector(OnnxModel(fsdd_model.onnx_path), config)
    paired = StreamingDetector(pair, config)
    assert isinstance(paired._windows, FeatureWindows) and isinstance(one_file._windows, WaveformWindows)
    expected, expected_windows = run(one_file, audio)
    found, windows = run(paired, audio)
    assert len(windows) == len(expected_windows) >= 100
    assert float(np.max(np.abs(windows - expected_windows))) <= 1e-4
    assert [(d.label, d.time_s) for d in found] == [(d.label, d.time_s) for d in expected]
    assert [d.confidence for d in found] == pytest.approx([d.confidence for d in expected], abs=1e-4)
    assert len(expected) >= 20, "most of the 30 digits are heard"
    computed = paired._windows.ring.computed
    assert computed < 0.5 * len(windows) * pair.frames, "new frames only, not every window's all"


def test_a_swap_between_one_file_and_a_pair_changes_no_detection(fsdd_model, pair):
    audio = stream([("jackson", 2), ("nicolas", 4)])
    one = OnnxModel(fsdd_model.onnx_path)
    expected, _ = run(StreamingDetector(one), audio)
    frames = len(audio) // FRAME
    swaps = {frames // 5: pair, 2 * frames // 5: one, 3 * frames // 5 + 3: pair}  # mid-word, some of them
    found, _ = run(StreamingDetector(one), audio, swaps)
    assert [(d.label, d.time_s) for d in found] == [(d.label, d.time_s) for d in expected]
    detector = StreamingDetector(pair)
    found, _ = run(detector, audio, {frames // 3: pair, 2 * frames // 3: one})
    assert [(d.label, d.time_s) for d in found] == [(d.label, d.time_s) for d in expected]
    assert isinstance(detector._windows, WaveformWindows)


def test_a_local_pair_is_taken_only_when_it_is_the_files_model(fsdd_model, tmp_path, caplog):
    source_frontend, source_classifier = meta.pair_paths(fsdd_model.onnx_path)
    path = tmp_path / "model.onnx"
    path.write_bytes(fsdd_model.onnx_path.read_bytes())
    assert type(load_local(path)) is OnnxModel, "no pair beside it"
    frontend, classifier = meta.pair_paths(path)
    frontend.write_bytes(source_frontend.read_bytes())
    classifier.write_bytes(source_classifier.read_bytes())
    assert isinstance(load_local(path), PairedModel)
    with_metadata(fsdd_model.onnx_path, path, threshold="0.9")  # the file re-exported: another threshold
    assert type(load_local(path)) is OnnxModel
    assert "differ from the file's" in caplog.text
    classifier.write_bytes(b"not onnx")
    path.write_bytes(fsdd_model.onnx_path.read_bytes())
    assert type(load_local(path)) is OnnxModel
    assert "not a usable fedspeech ONNX model" in caplog.text


def deaf_follower(url: str, topic_root: str, tmp_path: Path) -> ModelFollower:
    """A follower that hears nothing on its broker: it takes what the coordinator answers over HTTP."""
    return ModelFollower(
        url, BrokerSettings(f"mqtt://127.0.0.1:{free_port()}"), topic_root, state_dir=tmp_path
    )


def test_a_listener_takes_the_pair_a_coordinator_announces(tmp_path, mosquitto_url, topic_root, caplog):
    caplog.set_level(logging.INFO, logger="fedspeech.runtime")
    settings = {**SETTINGS, "broker": mosquitto_url, "topic_root": topic_root}
    with running_coordinator(tmp_path, **settings) as (service, url):
        follower = deaf_follower(url, topic_root, tmp_path / "listen")
        follower.start()
        try:
            model = wait_for(lambda: follower.model, 120, "the listener's first model", interval=0.1)
        finally:
            follower.stop()
        record = service.store.latest_round()
    assert isinstance(model, PairedModel) and model.describe().endswith("round 0")
    assert record.frontend_sha256 is not None and record.classifier_sha256 is not None
    assert "as its front-end" in caplog.text
    waveforms = np.random.default_rng(0).standard_normal((2, model.num_samples)).astype(np.float32) * 0.1
    one = OnnxModel(service.store.model_path(0, "onnx"))
    np.testing.assert_allclose(model.predict(waveforms), one.predict(waveforms), atol=1e-5)


def test_an_announcement_without_the_pair_is_still_followed(tmp_path, mosquitto_url, topic_root, monkeypatch):
    fetch_announcement = model_follower.fetch_announcement

    def from_before_the_pair(*args, **kwargs) -> ModelAnnouncement | None:
        latest = fetch_announcement(*args, **kwargs)
        return None if latest is None else replace(latest, frontend=None, classifier=None)

    monkeypatch.setattr(model_follower, "fetch_announcement", from_before_the_pair)
    settings = {**SETTINGS, "broker": mosquitto_url, "topic_root": topic_root}
    with running_coordinator(tmp_path, **settings) as (_, url):
        follower = deaf_follower(url, topic_root, tmp_path / "listen")
        follower.start()
        try:
            model = wait_for(lambda: follower.model, 120, "the listener's first model", interval=0.1)
        finally:
            follower.stop()
    assert type(model) is OnnxModel and model.describe().endswith("round 0")
