"""A model as two graphs: the export split for every architecture, the ring of log-mel frames, the
announcement that names the pair (and one that does not), the store that keeps it.
"""

from dataclasses import replace

import numpy as np
import pytest

from fedspeech.coordinator.round import new_model
from fedspeech.coordinator.state.records import RoundRecord
from fedspeech.coordinator.state.store import Store
from fedspeech.protocol import messages, routes
from fedspeech.protocol import onnx_metadata as meta
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import BlobRef, ModelAnnouncement, ModelSpec
from fedspeech.runtime.windows import FeatureRing

RATE = 8000
LABELS = [str(digit) for digit in range(10)] + ["_none_"]


def _spec(name: str) -> ModelSpec:
    return ModelSpec(name, RATE, RATE, len(LABELS), depth=2 if name.startswith("transformer") else None)


# ---- the export split ----


@pytest.mark.parametrize("name", ["cnn", "cnn_bn", "emotion_cnn", "transformer", "transformer_post_ln"])
def test_the_pair_of_every_architecture_gives_the_one_files_probabilities(tmp_path, name):
    import torch

    from fedspeech.export.onnx_export import export_onnx
    from fedspeech.models import build_model
    from fedspeech.runtime.session import OnnxModel, PairedModel

    torch.manual_seed(0)
    path = export_onnx(build_model(_spec(name)), _spec(name), LABELS, tmp_path / "m.onnx", round=2, pair=True)
    frontend, classifier = meta.pair_paths(path)
    assert (frontend.name, classifier.name) == ("m.frontend.onnx", "m.classifier.onnx")
    one, pair = OnnxModel(path), PairedModel(frontend, classifier)
    waveforms = np.random.default_rng(0).standard_normal((3, RATE)).astype(np.float32) * 0.1
    waveforms[2, : RATE // 2] = 0.0  # half a window of silence: the log's floor
    np.testing.assert_allclose(pair.predict(waveforms), one.predict(waveforms), atol=1e-5)
    assert (pair.hop_samples, pair.fft_samples, pair.frames, pair.n_mels) == (80, 256, 97, 40)
    assert pair.metadata[meta.PART] == meta.CLASSIFIER and pair.metadata[meta.ROUND] == "2"
    # the front-end takes any length of at least one FFT window: frames of a longer stream are the window's
    longer = np.random.default_rng(1).standard_normal((1, RATE + 800)).astype(np.float32) * 0.1
    streamed = pair.features(longer)
    assert streamed.shape == (1, 40, 107)
    np.testing.assert_allclose(streamed[:, :, 10:], pair.features(longer[:, 800:]), atol=1e-6)
    assert pair.features(longer[:, :256]).shape == (1, 40, 1)


def test_the_classifier_template_takes_new_weights_as_the_one_file_does(tmp_path):
    import torch

    from fedspeech.export.onnx_export import export_classifier, export_frontend, export_onnx
    from fedspeech.export.onnx_weights import update_onnx_weights
    from fedspeech.models import build_model
    from fedspeech.models.train import get_arrays
    from fedspeech.runtime.session import OnnxModel, PairedModel

    spec = _spec("cnn")
    torch.manual_seed(0)
    template = build_model(spec)
    frontend = export_frontend(template, spec, LABELS, tmp_path / "f.onnx")
    classifier = export_classifier(template, spec, LABELS, tmp_path / "c.onnx")
    trained = build_model(spec)  # other weights
    arrays = get_arrays(trained)
    one = export_onnx(trained, spec, LABELS, tmp_path / "one.onnx", round=5, threshold=0.7)
    update_onnx_weights(classifier, arrays, tmp_path / "c5.onnx", round=5, threshold=0.7)
    update_onnx_weights(frontend, {}, tmp_path / "f5.onnx", round=5, threshold=0.7)
    pair = PairedModel(tmp_path / "f5.onnx", tmp_path / "c5.onnx")
    waveforms = np.random.default_rng(0).standard_normal((2, RATE)).astype(np.float32) * 0.1
    np.testing.assert_allclose(pair.predict(waveforms), OnnxModel(one).predict(waveforms), atol=1e-5)
    assert pair.metadata[meta.THRESHOLD] == "0.7000"
    with pytest.raises(ValueError, match="not one model's"):  # a front-end of another round
        PairedModel(frontend, tmp_path / "c5.onnx")


def test_a_model_without_a_logmel_frontend_is_not_split(tmp_path):
    import torch

    from fedspeech.export.onnx_export import export_classifier

    with pytest.raises(ValueError, match="no LogMel frontend"):
        export_classifier(torch.nn.Linear(2, 2), _spec("cnn"), LABELS, tmp_path / "c.onnx")


# ---- the ring of log-mel frames ----

HOP, FFT, WINDOW = 4, 10, 40  # a toy grid: 8 frames a window
FRAMES = 1 + (WINDOW - FFT) // HOP


def toy_features(samples: np.ndarray) -> np.ndarray:
    """Frames (1, 2, k) of samples (1, (k - 1) * HOP + FFT): each frame's sum and its first sample."""
    k = 1 + (samples.shape[1] - FFT) // HOP
    frames = np.stack([samples[0, i * HOP : i * HOP + FFT] for i in range(k)])
    return np.stack([frames.sum(axis=1), frames[:, 0]])[None].astype(np.float32)


class Stream:
    """Samples pushed a hop at a time into a ring of one window, as the detector keeps them."""

    def __init__(self, seed: int = 0):
        self.ring = np.zeros(WINDOW, np.float32)
        self.all = np.zeros(0, np.float32)
        self.rng = np.random.default_rng(seed)

    def push(self, count: int) -> None:
        for value in self.rng.standard_normal(count).astype(np.float32):
            self.ring[len(self.all) % WINDOW] = value
            self.all = np.append(self.all, value)

    def window(self) -> np.ndarray:
        """The newest window of samples, oldest first, silence before the stream's start."""
        padded = np.concatenate([np.zeros(WINDOW, np.float32), self.all])
        return padded[-WINDOW:][None]


@pytest.mark.parametrize("hop_samples", [HOP, 3 * HOP, WINDOW, 2 * WINDOW])
def test_the_ring_gives_each_window_its_own_frames_computing_new_ones_only(hop_samples):
    calls: list[int] = []

    def counted(samples: np.ndarray) -> np.ndarray:
        calls.append(samples.shape[1])
        return toy_features(samples)

    ring, stream = FeatureRing(counted, 2, FRAMES, HOP, FFT, WINDOW), Stream()
    for n in range(1, 30):
        stream.push(hop_samples)
        window = ring.window(stream.ring, len(stream.all))
        np.testing.assert_array_equal(window, toy_features(stream.window()), err_msg=f"window {n}")
    new = min(FRAMES, hop_samples // HOP)
    assert ring.computed == FRAMES + 28 * new, "a whole window first, then only the frames each hop adds"
    assert max(calls) == (FRAMES - 1) * HOP + FFT and calls[-1] == (new - 1) * HOP + FFT


def test_the_ring_after_a_gap_and_at_the_stream_start():
    ring, stream = FeatureRing(toy_features, 2, FRAMES, HOP, FFT, WINDOW), Stream(1)
    steps = [(8, True), (4, False), (12, True), (4, True), (60, False), (8, True), (4, True)]
    for pushed, classified in steps:
        stream.push(pushed)
        if classified:  # windows skipped (silence) leave frames to compute, up to a whole window
            window = ring.window(stream.ring, len(stream.all))
            np.testing.assert_array_equal(window, toy_features(stream.window()))
    with pytest.raises(ValueError, match="off the grid"):
        stream.push(1)
        ring.window(stream.ring, len(stream.all))
    with pytest.raises(ValueError, match="do not tile"):
        FeatureRing(toy_features, 2, FRAMES, 3, FFT, WINDOW)


# ---- the announcement and the store ----


def _ref(round: int, kind: str) -> BlobRef:
    return BlobRef(routes.model(round, kind), "ab" * 32, 100)


ANNOUNCEMENT = ModelAnnouncement(
    3, _spec("cnn"), LABELS, _ref(3, "weights"), _ref(3, "onnx"), frontend=_ref(3, "frontend"),
    classifier=_ref(3, "classifier"),
)  # fmt: skip


def test_an_announcement_names_the_pair_or_not_and_an_old_one_still_parses():
    assert messages.decode(messages.encode(ANNOUNCEMENT), ModelAnnouncement) == ANNOUNCEMENT
    old = messages.encode(replace(ANNOUNCEMENT, frontend=None, classifier=None)).replace(
        b',"frontend":null,"classifier":null', b""
    )
    assert b"frontend" not in old  # as a coordinator from before the pair sends it
    decoded = messages.decode(old, ModelAnnouncement)
    assert decoded.frontend is decoded.classifier is None and decoded.onnx == ANNOUNCEMENT.onnx
    for bad, why in [
        (replace(ANNOUNCEMENT, classifier=None), "both graphs"),
        (replace(ANNOUNCEMENT, frontend=_ref(2, "frontend")), "another round"),
        (replace(ANNOUNCEMENT, classifier=_ref(3, "onnx")), "classifier"),
        (replace(ANNOUNCEMENT, frontend=replace(_ref(3, "frontend"), size=0)), "frontend reference"),
    ]:
        with pytest.raises(ProtocolError, match=why):
            messages.decode(messages.encode(bad), ModelAnnouncement)


class _Model:
    """What new_model.announcement asks of the model."""

    labels = LABELS

    def spec_of(self, arrays) -> ModelSpec:
        return _spec("cnn")


def test_the_store_keeps_replaces_and_announces_the_pair_and_a_round_without_one(tmp_path):
    store = Store(tmp_path)
    record = RoundRecord(1, 0.0, 1.0, 1.0, 1, 1, None, None, None, 0, 0, "cd" * 32, "ef" * 32)
    store.save_round(record, b"weights", b"onnx", [])  # as a round stored before the pair
    without = new_model.announcement(store, _Model(), store.rounds()[0], {})  # type: ignore[arg-type]
    assert without.frontend is without.classifier is None and without.onnx is not None
    paired = store.replace_onnx(record, b"onnx 2", (b"front", b"classifier"))
    assert store.rounds()[0] == paired and paired.classifier_sha256 is not None
    announced = new_model.announcement(store, _Model(), paired, {})  # type: ignore[arg-type]
    assert announced.classifier is not None and announced.frontend is not None
    assert (announced.frontend.size, announced.classifier.size) == (5, 10)
    assert store.model_path(1, "classifier").read_bytes() == b"classifier"
    again = store.replace_onnx(paired, b"onnx 3")  # a model that no longer splits: the pair goes
    assert again.frontend_sha256 is None and not store.model_path(1, "frontend").exists()
    assert Store(tmp_path).rounds()[0] == again  # as a restart reads it


def test_the_spoken_forms_travel_in_the_one_file_and_its_pair(tmp_path):
    from fedspeech.export.onnx_export import export_onnx
    from fedspeech.models import build_model
    from fedspeech.runtime.session import OnnxModel, PairedModel

    say = {"7": "seven", "lights_on": "not a label of this task"}
    spec = _spec("cnn")
    path = export_onnx(build_model(spec), spec, LABELS, tmp_path / "m.onnx", say=say, pair=True)
    for model in (OnnxModel(path), PairedModel(*meta.pair_paths(path))):
        assert model.spoken("7") == "seven" and model.spoken("3") == "3"
        assert "lights_on" not in model.metadata[meta.SAY]  # only the task's own labels
    plain = OnnxModel(export_onnx(build_model(_spec("cnn")), _spec("cnn"), LABELS, tmp_path / "plain.onnx"))
    assert meta.SAY not in plain.metadata and plain.spoken("_none_") == "none"
