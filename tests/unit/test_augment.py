"""Training that sounds like listening: speech anywhere, noise at random SNRs, background as the none class,
and the task's negatives that bring the background noise."""

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from fedspeech.edge_client import local_data
from fedspeech.edge_client.local_data import MAX_WINDOWS_PER_FILE, DataSource, LocalData
from fedspeech.models import build_model
from fedspeech.models.clips.augment import (
    DEFAULT_AUGMENTATION,
    Augmentation,
    add_noise,
    augment_batch,
    background_windows,
    mix_at_snr,
    place_anywhere,
    spoken_extents,
)
from fedspeech.models.clips.datasets import (
    bundled_data_dir,
    default_spec,
    load_corpus,
    load_waveforms,
    load_windows,
    server_test_clips,
)
from fedspeech.models.clips.tasks import BUILTIN_TASKS, TaskFileError, load_task
from fedspeech.protocol import messages
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.labels import NONE_LABEL
from fedspeech.protocol.message_checks import check_definition
from fedspeech.protocol.messages import ModelSpec, TaskDefinition, TaskInfo

DATA = Path(__file__).resolve().parents[2] / "data"
NOISE = DATA / "_background_noise_"
RATE, FRAME = 8000, 80  # FSDD's rate, and its 10 ms frame
FSDD = BUILTIN_TASKS["fsdd"]
SPEC = ModelSpec("cnn", 16000, 16000, 3)


@pytest.fixture(scope="module")
def clips() -> tuple[np.ndarray, np.ndarray]:
    """32 FSDD training clips of 1 s, zero-padded around the speech, and their labels."""
    corpus = load_corpus("fsdd")
    return load_waveforms([c for c in corpus.clips if not c.test][::80][:32], RATE, RATE)


@pytest.fixture(scope="module")
def pool() -> np.ndarray:
    """Real background noise: windows of the bundled clips."""
    return np.concatenate([load_windows(path, RATE, RATE, 1) for path in sorted(NOISE.glob("*.flac"))[:20]])


def _snr_db(clean: np.ndarray, mixed: np.ndarray, start: int, end: int) -> float:
    noise = mixed[start:end].astype(np.float64) - clean[start:end]
    return 10 * np.log10(np.mean(np.square(clean[start:end], dtype=np.float64)) / np.mean(noise**2))


def _matches_a_window_of(signal: np.ndarray, pool: np.ndarray) -> bool:
    """Whether signal is a scaled, circularly shifted row of pool (normalised cross-correlation ~ 1)."""
    spectrum = np.fft.rfft(signal.astype(np.float64))
    for row in pool.astype(np.float64):
        correlation = np.fft.irfft(spectrum * np.conj(np.fft.rfft(row)), len(signal))
        if correlation.max() / (np.linalg.norm(signal) * np.linalg.norm(row)) > 0.999:
            return True
    return False


def _shift_of(row: np.ndarray, original: np.ndarray) -> int:
    """The k for which row is np.roll(original, k) (asserted)."""
    correlation = np.fft.irfft(np.fft.rfft(row) * np.conj(np.fft.rfft(original)), len(row))
    shift = int(correlation.argmax())
    assert np.array_equal(row, np.roll(original, shift)), "a clip is only rolled"
    return shift


def test_speech_lands_anywhere_inside_the_window(clips):
    waveforms = clips[0]
    starts, ends = spoken_extents(waveforms, FRAME, 0.1)
    assert np.all(starts > 0) and np.all(ends < RATE) and np.all(ends - starts > 0.1 * RATE)
    placed = place_anywhere(np.repeat(waveforms[:1], 400, axis=0), np.random.default_rng(0), FRAME, 0.1)
    shifts = np.array([_shift_of(row, waveforms[0]) for row in placed])
    shifts[shifts > RATE - ends[0]] -= RATE  # a roll to the left, as a negative offset
    assert np.all(starts[0] + shifts >= 0) and np.all(ends[0] + shifts <= RATE), "speech stays inside"
    # uniform over the allowed offsets: both ends of the window are reached, and most offsets in between
    assert shifts.min() + starts[0] < 0.05 * RATE and RATE - ends[0] - shifts.max() < 0.05 * RATE
    assert len(set(shifts.tolist())) > 300
    assert np.mean(np.abs(shifts)) > 0.1 * RATE, "far more than the old +-10% shift"


def test_speech_that_fills_the_window_stays_put():
    rng = np.random.default_rng(1)
    full = (0.1 * rng.standard_normal((3, RATE))).astype(np.float32)
    assert np.array_equal(place_anywhere(full, rng, FRAME, 0.1), full)


def test_noise_is_mixed_at_the_drawn_snr_on_the_spoken_part(clips, pool):
    waveforms = clips[0]
    starts, ends = spoken_extents(waveforms, FRAME, 0.1)
    rng = np.random.default_rng(2)
    for i, snr in enumerate([-5.0, 0.0, 7.5, 20.0, 40.0]):
        for noise in (rng.standard_normal(RATE).astype(np.float32), pool[i]):
            mixed = mix_at_snr(waveforms[i], noise, snr, (starts[i], ends[i]))
            assert mixed.dtype == np.float32
            assert _snr_db(waveforms[i], mixed, starts[i], ends[i]) == pytest.approx(snr, abs=0.1)
    # in a batch: every clip gets noise at an SNR inside the range
    augmentation = Augmentation(noise_probability=1.0, snr_db=(10.0, 20.0))
    noisy = add_noise(waveforms, rng, augmentation, pool, FRAME)
    measured = [_snr_db(w, m, s, e) for w, m, s, e in zip(waveforms, noisy, starts, ends, strict=True)]
    assert all(9.9 < snr < 20.1 for snr in measured) and np.std(measured) > 1.0


def test_noise_comes_from_the_pool_or_is_white(clips, pool):
    waveforms = clips[0][:8]
    rng = np.random.default_rng(3)
    from_pool = add_noise(waveforms, rng, Augmentation(noise_probability=1.0, white_share=0.0), pool, FRAME)
    assert all(_matches_a_window_of(m - w, pool) for w, m in zip(waveforms, from_pool, strict=True))
    white = add_noise(waveforms, rng, Augmentation(noise_probability=1.0, white_share=1.0), pool, FRAME)
    assert not any(_matches_a_window_of(m - w, pool) for w, m in zip(waveforms, white, strict=True))
    clean = add_noise(waveforms, rng, Augmentation(noise_probability=0.0), pool, FRAME)
    assert np.array_equal(clean, waveforms)


def test_background_windows_are_silence_white_noise_and_pool_windows(pool):
    rng = np.random.default_rng(4)
    windows = background_windows(200, RATE, rng, DEFAULT_AUGMENTATION, pool)
    silent = ~windows.any(axis=1)
    from_pool = np.array(
        [not s and _matches_a_window_of(w, pool) for w, s in zip(windows, silent, strict=True)]
    )
    white = ~silent & ~from_pool
    assert 5 < silent.sum() < 40 and from_pool.sum() > 50 and white.sum() > 50
    levels = 20 * np.log10(np.sqrt(np.mean(np.square(windows[white], dtype=np.float64), axis=1)))
    low, high = DEFAULT_AUGMENTATION.white_level_db
    assert np.all((low - 0.5 < levels) & (levels < high + 0.5)) and np.ptp(levels) > 20, "random levels"
    no_pool = background_windows(50, RATE, rng, DEFAULT_AUGMENTATION, pool[:0])
    assert not any(_matches_a_window_of(w, pool) for w in no_pool if w.any())


def test_a_batch_gets_background_windows_labelled_as_the_none_class(clips, pool):
    waveforms, labels = clips
    rng = np.random.default_rng(5)
    always = dataclasses.replace(DEFAULT_AUGMENTATION, background_share=1.0)
    batch, batch_labels = augment_batch(waveforms, labels, rng, always, RATE, pool, none_class=10)
    assert batch.shape == (64, RATE) and batch.dtype == np.float32
    assert batch_labels is not None
    assert batch_labels[:32].tolist() == labels.tolist() and batch_labels[32:].tolist() == [10] * 32
    assert not any(_matches_a_window_of(row, waveforms) for row in batch[32:] if row.any()), "no speech"
    # about background_share of the batch, on average
    sizes = [
        len(augment_batch(waveforms, labels, rng, DEFAULT_AUGMENTATION, RATE, pool, 10)[0])
        for _ in range(100)
    ]
    assert 32 + 2.5 < np.mean(sizes) < 32 + 4.0
    # no label to give them: without labels (distillation) or without a none class
    assert augment_batch(waveforms, None, rng, always, RATE, pool, 10)[0].shape == (32, RATE)
    assert augment_batch(waveforms, labels, rng, always, RATE, pool, None)[0].shape == (32, RATE)
    # nor without negatives to widen: the none class then learns from its own clips alone
    assert augment_batch(waveforms, labels, rng, always, RATE, pool[:0], 10)[0].shape == (32, RATE)
    assert augment_batch(waveforms, labels, rng, always, RATE, None, 10)[0].shape == (32, RATE)


def test_augmentation_is_deterministic_per_seed(clips, pool):
    waveforms, labels = clips

    def run(seed: int) -> tuple[np.ndarray, np.ndarray | None]:
        return augment_batch(
            waveforms, labels, np.random.default_rng(seed), DEFAULT_AUGMENTATION, RATE, pool, 10
        )

    (first, first_labels), (again, again_labels), (other, _) = run(7), run(7), run(8)
    assert np.array_equal(first, again) and np.array_equal(first_labels, again_labels)
    assert not np.array_equal(first[:32], other[:32])


def test_a_silent_clip_gets_no_noise_and_no_warning(pool):
    silent = np.zeros((4, RATE), dtype=np.float32)
    loud = Augmentation(noise_probability=1.0)
    with np.errstate(all="raise"):
        assert spoken_extents(silent, FRAME, 0.1)[1].tolist() == [RATE] * 4
        batch, _ = augment_batch(silent, None, np.random.default_rng(0), loud, RATE, pool)
        assert np.array_equal(batch, silent)
        assert np.array_equal(mix_at_snr(silent[0], pool[0], 10.0, (0, RATE)), silent[0])
        assert np.array_equal(mix_at_snr(pool[0], silent[0], 10.0, (0, RATE)), pool[0]), "silent noise"


def test_bad_settings_and_pool_are_refused(clips):
    with pytest.raises(ValueError, match="noise_probability must be between 0 and 1"):
        Augmentation(noise_probability=1.5)
    with pytest.raises(ValueError, match="snr_db must be a finite range"):
        Augmentation(snr_db=(20.0, 10.0))
    with pytest.raises(ValueError, match="noise pool must be"):
        augment_batch(clips[0], None, np.random.default_rng(0), DEFAULT_AUGMENTATION, RATE, np.zeros((2, 10)))


# negatives: the task's setting


def test_fsdd_task_keeps_the_digits_indices_and_adds_the_none_class():
    assert FSDD.labels == [*"0123456789", NONE_LABEL] and FSDD.negatives == ["_background_noise_"]
    assert load_corpus("fsdd").labels == tuple("0123456789"), "corpus labels 0-9 keep indices 0-9"
    assert default_spec(load_corpus("fsdd")).num_classes == 11


@pytest.mark.parametrize(
    ("negatives", "message"),
    [
        ([f"n{i}" for i in range(17)], "at most 16"),
        (["x" * 101], "1 to 100 printable characters"),
        ([""], "1 to 100 printable characters"),
        (["noise\nWARNING forged"], "1 to 100 printable characters"),
        (["../secrets"], "inside the data folder"),
        (["noise/../../etc"], "inside the data folder"),
        (["/etc/passwd"], "inside the data folder"),
        (["."], "inside the data folder"),
        (["yes/old"], "in the folder of label 'yes'"),
    ],
)
def test_negatives_are_bounded(negatives, message):
    definition = TaskDefinition("t", ["yes", "no", NONE_LABEL], 16000, 1.0, negatives)
    with pytest.raises(ProtocolError, match=message) as error:
        check_definition(definition)
    assert "\n" not in str(error.value) and len(str(error.value)) < 200
    body = json.loads(messages.encode(TaskInfo(dataclasses.replace(definition, negatives=[]), SPEC)))
    body["definition"]["negatives"] = negatives
    with pytest.raises(ProtocolError, match=message):
        messages.decode(json.dumps(body), TaskInfo)


def test_negatives_travel_in_messages_and_old_messages_still_decode():
    info = TaskInfo(TaskDefinition("t", ["yes", NONE_LABEL], 16000, 1.0, ["noise", "more/one.wav"]), SPEC)
    assert messages.decode(messages.encode(info), TaskInfo) == info
    old = json.loads(messages.encode(info))
    del old["definition"]["negatives"]
    assert messages.decode(json.dumps(old), TaskInfo).definition.negatives == []
    with pytest.raises(ProtocolError, match="train a none class"):
        check_definition(TaskDefinition("t", ["yes", "no"], 16000, 1.0, ["noise"]))
    old["definition"]["negatives"] = "noise"
    with pytest.raises(ProtocolError):
        messages.decode(json.dumps(old), TaskInfo)


def test_a_task_file_with_negatives_gets_the_none_class(tmp_path):
    path = tmp_path / "task.toml"
    base = 'name = "t"\nsample_rate = 16000\nclip_seconds = 1.0\n'
    path.write_text(base + 'labels = ["yes", "no"]\nnegatives = ["noise"]\n')
    assert load_task(path).labels == ["yes", "no", NONE_LABEL] and load_task(path).negatives == ["noise"]
    path.write_text(base + 'labels = ["yes", "_silence_"]\nnegatives = ["noise"]\n')
    assert load_task(path).labels == ["yes", "_silence_"], "Speech Commands' none class is kept"
    path.write_text(base + 'labels = ["yes", "no"]\n')
    assert load_task(path).labels == ["yes", "no"] and load_task(path).negatives == []
    path.write_text(base + 'labels = ["yes", "no"]\nnegatives = [1]\n')
    with pytest.raises(TaskFileError, match="key 'negatives' must be a list of strings"):
        load_task(path)
    path.write_text(base + 'labels = ["yes", "no"]\nnegatives = ["../x"]\n')
    with pytest.raises(TaskFileError, match="negatives: '../x' must be a path inside the data folder"):
        load_task(path)


# negatives on the device


def _data_folder(root: Path) -> Path:
    recordings = DATA / "fsdd" / "recordings"
    for digit in "01":
        (root / digit).mkdir(parents=True)
        for take in range(10):
            shutil.copyfile(recordings / f"{digit}_theo_{take}.flac", root / digit / f"{take}.flac")
    (root / "_background_noise_").mkdir()
    for path in sorted(NOISE.glob("*.flac"))[:3]:
        shutil.copyfile(path, root / "_background_noise_" / path.name)
    noise = np.random.default_rng(0).normal(0, 0.05, 16000 * 45).astype(np.float32)
    soundfile.write(root / "_background_noise_" / "long.flac", noise, 16000)  # 45 s of noise at 16 kHz
    return root


def test_a_device_loads_its_negatives_as_training_clips_of_the_none_class(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    root = _data_folder(tmp_path / "data")
    task = TaskDefinition("t", ["0", "1", NONE_LABEL], 8000, 1.0, ["_background_noise_", "missing"])
    data = LocalData(DataSource(folder=root))
    data.refresh(task)
    windows = 3 + MAX_WINDOWS_PER_FILE  # a clip each, the first 30 s of the long file
    assert data.train.negatives.shape == (windows, 8000)  # all of them are noise to mix in
    # as training clips of the none class, as many as the commonest label has
    commonest = max(data.train.counts["0"], data.train.counts["1"])
    assert data.train.counts[NONE_LABEL] == commonest < windows
    assert NONE_LABEL not in data.test.counts and sum(data.test.counts.values()) > 0
    examples = data.train.waveforms[data.train.labels == 2]
    assert all(any(np.array_equal(e, n) for n in data.train.negatives) for e in examples)
    assert caplog.text.count("no negatives") == 1
    assert "is not a label" not in caplog.text, "a negatives folder is no stray folder"
    data.refresh(task)
    assert caplog.text.count("no negatives") == 1, "logged once"
    assert data.train.counts[NONE_LABEL] == commonest


def test_negatives_are_bounded_in_all(tmp_path, monkeypatch):
    root = _data_folder(tmp_path / "data")
    monkeypatch.setattr(local_data, "MAX_NEGATIVE_WINDOWS", 10)
    data = LocalData(DataSource(folder=root))
    data.refresh(TaskDefinition("t", ["0", "1", NONE_LABEL], 8000, 1.0, ["_background_noise_"]))
    assert len(data.train.negatives) == 10


def test_a_negative_that_leads_out_of_the_data_folder_is_refused(tmp_path, caplog):
    root = _data_folder(tmp_path / "data")
    outside = tmp_path / "private"
    outside.mkdir()
    shutil.copyfile(NOISE / "1024.flac", outside / "secret.flac")
    (root / "link").symlink_to(outside)
    (root / "_background_noise_" / "inner").symlink_to(outside)  # a folder inside: not a file, passed over
    task = TaskDefinition("t", ["0", "1", NONE_LABEL], 8000, 1.0, ["link", "link/secret.flac"])
    data = LocalData(DataSource(folder=root))
    data.refresh(task)
    assert NONE_LABEL not in data.train.counts and len(data.train.negatives) == 0
    assert f"skipping {root / 'link'}: a negative must be inside the data folder" in caplog.text
    data.refresh(TaskDefinition("t", ["0", "1", NONE_LABEL], 8000, 1.0, ["_background_noise_"]))
    assert len(data.train.negatives) == 3 + MAX_WINDOWS_PER_FILE


def test_a_corpus_speaker_takes_the_bundled_negatives():
    assert len(list((bundled_data_dir() / "_background_noise_").glob("*.flac"))) == 204
    data = LocalData(DataSource(corpus="fsdd", speaker="theo"))
    data.refresh(FSDD)
    assert len(data.train.negatives) == 204  # all of them noise to mix in
    assert data.train.counts[NONE_LABEL] == data.train.counts["0"] == 45  # as many clips as a label
    assert NONE_LABEL not in data.test.counts and data.test.counts["9"] == 5


# training with it


def test_the_cnn_still_learns_fsdd_with_the_augmentation(pool):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    corpus = load_corpus("fsdd")
    spec = default_spec(corpus)
    train = [c for c in corpus.clips if not c.test][::2]
    waveforms, labels = load_waveforms(train, spec.sample_rate, spec.num_samples)
    heldout = load_waveforms(server_test_clips(corpus), spec.sample_rate, spec.num_samples)
    model = build_model(spec)
    none = FSDD.labels.index(NONE_LABEL)
    from fedspeech.models.train import evaluate, train_local

    train_local(
        model, waveforms, labels, epochs=4, batch_size=32, learning_rate=3e-3, noise=pool, none_class=none
    )
    assert evaluate(model, *heldout).accuracy > 0.8
    unseen = np.concatenate(
        [load_windows(path, RATE, RATE, 1) for path in sorted(NOISE.glob("*.flac"))[100:150]]
    )
    with torch.no_grad():
        predictions = model(torch.from_numpy(unseen)).argmax(dim=1)
    assert (predictions == none).float().mean() > 0.8, "background noise it never heard is the none class"
