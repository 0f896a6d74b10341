"""Speech corpora on disk, their speaker partitions (one speaker = one client) and audio loading."""

import importlib.resources
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import soundfile
import soxr

from fedspeech.models.clips.tasks import (
    BUILTIN_TASKS,
    EMODB_LABELS,
    FSDD_LABELS,
    SPEECH_COMMANDS_LABELS,
    spec_for,
)
from fedspeech.protocol.messages import ModelSpec, TaskDefinition

# corpus name -> folder name inside a data directory
CORPORA: dict[str, str] = {"fsdd": "fsdd", "emodb": "emodb", "speech_commands": "speech_commands_test"}
EMODB_LETTERS = "WLEAFTN"  # the emotion letter in EmoDB's file names, in the order of EMODB_LABELS
SILENCE_SPEAKER = "_silence_"
TEST_FRACTION = 0.2
SILENT_PEAK = 2 / 32768  # a file whose loudest sample is under two steps of 16-bit audio holds nothing
MAX_FILE_SECONDS = 30.0  # longer files are not clips: refused rather than read whole
MAX_FILE_BYTES = 50 * 1024 * 1024


@dataclass(frozen=True)
class Clip:
    """One recording: its file, class index, speaker and whether it belongs to the test split."""

    path: Path
    label: int
    speaker: str
    test: bool


@dataclass(frozen=True)
class Corpus:
    """A labelled corpus: class names, native sample rate and all its clips."""

    name: str
    labels: tuple[str, ...]
    sample_rate: int
    clips: tuple[Clip, ...]

    @property
    def task(self) -> TaskDefinition:
        """The built-in task that learns this corpus' labels."""
        return BUILTIN_TASKS[self.name]


class AudioError(ValueError):
    """An audio file that cannot be used; the text says why."""


def bundled_data_dir() -> Path:
    """The data folder shipped with the package (holds fsdd/)."""
    return Path(str(importlib.resources.files("fedspeech.data")))


def load_corpus(name: str, data_dir: Path | None = None) -> Corpus:
    """List a corpus from data_dir (default: the bundled data) with its train/test split decided."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}, expected one of {sorted(CORPORA)}")
    root = Path(data_dir) if data_dir is not None else bundled_data_dir()
    folder = root / CORPORA[name]
    if not folder.is_dir():
        if data_dir is None:
            raise FileNotFoundError(
                f"corpus {name!r} is not in the bundled data (which holds fsdd): give the folder that "
                f"holds {CORPORA[name]}/ as --data-dir DIR"
            )
        raise FileNotFoundError(
            f"corpus {name!r} not found: no folder {folder} (--data-dir DIR must hold {CORPORA[name]}/)"
        )
    if name == "fsdd":
        corpus = _list_fsdd(folder)
    elif name == "emodb":
        corpus = _list_emodb(folder)
    else:
        corpus = _list_speech_commands(folder)
    if not corpus.clips:
        raise FileNotFoundError(f"corpus {name!r}: no .flac files under {folder}")
    return corpus


def _list_fsdd(folder: Path) -> Corpus:
    clips = []
    for path in sorted((folder / "recordings").glob("*.flac")):
        digit, speaker, index = path.stem.split("_")
        # FSDD's own convention: indices 0-4 of each digit and speaker are the test set
        clips.append(Clip(path, int(digit), speaker, int(index) < 5))
    return Corpus("fsdd", tuple(FSDD_LABELS), 8000, tuple(clips))


def _list_emodb(folder: Path) -> Corpus:
    paths = sorted((folder / "wav").glob("*.flac"))
    items = [(path, EMODB_LETTERS.index(path.stem[5]), path.stem[0:2]) for path in paths]
    return Corpus("emodb", tuple(EMODB_LABELS), 16000, _split_by_speaker(items, folder))


def _speech_commands_speaker(path: Path) -> str:
    if path.parent.name == "_silence_":
        return SILENCE_SPEAKER
    # '<hash>_nohash_<n>' or, in _unknown_, '<word>_<hash>_nohash_<n>'
    return path.stem.split("_nohash_")[0].split("_")[-1]


def _list_speech_commands(folder: Path) -> Corpus:
    items = []
    for label, word in enumerate(SPEECH_COMMANDS_LABELS):
        for path in sorted((folder / word).glob("*.flac")):
            items.append((path, label, _speech_commands_speaker(path)))
    return Corpus("speech_commands", tuple(SPEECH_COMMANDS_LABELS), 16000, _split_by_speaker(items, folder))


def _split_by_speaker(items: list[tuple[Path, int, str]], folder: Path) -> tuple[Clip, ...]:
    """Deterministic 80/20 split inside each speaker, seeded by the speaker name (at least 1 test clip)."""
    by_speaker: dict[str, list[tuple[Path, int]]] = {}
    for path, label, speaker in items:
        by_speaker.setdefault(speaker, []).append((path, label))
    clips = []
    for speaker, files in by_speaker.items():
        files.sort(key=lambda item: item[0].relative_to(folder).as_posix())
        order = np.random.default_rng(zlib.crc32(speaker.encode())).permutation(len(files))
        num_test = max(1, round(TEST_FRACTION * len(files)))
        test_positions = set(order[:num_test].tolist())
        clips += [Clip(path, label, speaker, i in test_positions) for i, (path, label) in enumerate(files)]
    return tuple(sorted(clips, key=lambda clip: clip.path))


def speakers(corpus: Corpus) -> list[str]:
    """The corpus' speakers, sorted."""
    return sorted({clip.speaker for clip in corpus.clips})


def client_clips(corpus: Corpus, speaker: str) -> tuple[list[Clip], list[Clip]]:
    """(train, test) clips of one speaker."""
    own = [clip for clip in corpus.clips if clip.speaker == speaker]
    if not own:
        raise ValueError(f"corpus {corpus.name!r} has no speaker {speaker!r}")
    return [clip for clip in own if not clip.test], [clip for clip in own if clip.test]


def server_test_clips(corpus: Corpus) -> list[Clip]:
    """The union of all speakers' test clips."""
    return [clip for clip in corpus.clips if clip.test]


def leave_one_speaker_out(corpus: Corpus, speaker: str) -> tuple[list[Clip], list[Clip]]:
    """(train clips of all other speakers, all clips of the held-out speaker)."""
    held_out = [clip for clip in corpus.clips if clip.speaker == speaker]
    if not held_out:
        raise ValueError(f"corpus {corpus.name!r} has no speaker {speaker!r}")
    return [clip for clip in corpus.clips if clip.speaker != speaker and not clip.test], held_out


def load_audio(path: Path, sample_rate: int, num_samples: int) -> np.ndarray:
    """Read a file as float32 mono at sample_rate, centre-cropped or zero-padded to num_samples.

    AudioError, naming the file and the reason, for a file that is missing, empty, unreadable, too
    long, silent or not finite.
    """
    return _fit_length(_read(Path(path), sample_rate, MAX_FILE_SECONDS), num_samples)


def load_recording(path: Path, sample_rate: int, max_seconds: float) -> np.ndarray:
    """A whole recording as float32 mono at sample_rate; AudioError as load_audio, over max_seconds too."""
    return _read(Path(path), sample_rate, max_seconds)


def load_windows(path: Path, sample_rate: int, num_samples: int, max_windows: int) -> np.ndarray:
    """A file cut into consecutive (k, num_samples) windows, k at most max_windows; only those are read.

    A file shorter than one window is one window, zero-padded as load_audio pads. AudioError as load_audio
    gives, except that a long file is not refused: its first max_windows windows are used.
    """
    audio = _read(Path(path), sample_rate, max_windows * num_samples / sample_rate, cut=True)
    if len(audio) < num_samples:
        return _fit_length(audio, num_samples)[None]
    count = min(max_windows, len(audio) // num_samples)
    return np.ascontiguousarray(audio[: count * num_samples].reshape(count, num_samples))


def _read(path: Path, sample_rate: int, max_seconds: float, cut: bool = False) -> np.ndarray:
    """A file as float32 mono at sample_rate: refused if longer than max_seconds, or cut to them if cut."""
    if not path.is_file():
        raise AudioError(f"{path}: no such file")
    size = path.stat().st_size
    if size == 0:
        raise AudioError(f"{path}: empty file")
    max_bytes = MAX_FILE_BYTES * max(1.0, max_seconds / MAX_FILE_SECONDS)
    if not cut and size > max_bytes:
        raise AudioError(f"{path}: {size} bytes, more than {max_bytes:.0f} for {max_seconds:g} s")
    try:
        with soundfile.SoundFile(path) as f:
            length = f.frames / f.samplerate
            if not cut and length > max_seconds:
                raise AudioError(f"{path}: {length:.1f} s long, more than {max_seconds:g} s")
            frames = min(f.frames, math.ceil(max_seconds * f.samplerate))
            audio, rate = f.read(frames, dtype="float32", always_2d=True), f.samplerate
    except (RuntimeError, TypeError, OSError) as exc:  # soundfile.LibsndfileError is a RuntimeError
        raise AudioError(f"{path}: unreadable or corrupt audio ({exc})") from None
    if audio.shape[0] == 0:
        raise AudioError(f"{path}: no samples")
    audio = audio.mean(axis=1, dtype=np.float32)
    if not np.isfinite(audio).all():
        raise AudioError(f"{path}: NaN or infinite samples")
    if np.abs(audio).max() < SILENT_PEAK:
        raise AudioError(f"{path}: silent")
    if rate != sample_rate:
        audio = soxr.resample(audio, rate, sample_rate).astype(np.float32)
    return audio


def _fit_length(audio: np.ndarray, num_samples: int) -> np.ndarray:
    if len(audio) >= num_samples:
        start = (len(audio) - num_samples) // 2
        return np.ascontiguousarray(audio[start : start + num_samples])
    out = np.zeros(num_samples, dtype=np.float32)
    start = (num_samples - len(audio)) // 2
    out[start : start + len(audio)] = audio
    return out


def load_waveforms(
    clips: Sequence[Clip], sample_rate: int, num_samples: int
) -> tuple[np.ndarray, np.ndarray]:
    """Load clips into a (N, num_samples) float32 batch and their (N,) int64 labels."""
    waveforms = np.zeros((len(clips), num_samples), dtype=np.float32)
    for i, clip in enumerate(clips):
        waveforms[i] = load_audio(clip.path, sample_rate, num_samples)
    return waveforms, np.array([clip.label for clip in clips], dtype=np.int64)


def default_spec(
    corpus: Corpus, seconds: float | None = None, name: str | None = None, depth: int | None = None
) -> ModelSpec:
    """The model spec of a corpus' built-in task: its default model and clip length unless given."""
    task = corpus.task if seconds is None else replace(corpus.task, clip_seconds=seconds)
    return spec_for(task, name, depth)
