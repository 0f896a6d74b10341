"""A folder of one's own recordings, `DIR/<label>/*`, as labelled clips with a train/test split per file."""

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from fedspeech.models.clips.datasets import TEST_FRACTION, AudioError, Clip, load_audio
from fedspeech.protocol import log_lines
from fedspeech.protocol.labels import UNKNOWN_LABEL, other_speech_class

Reader = Callable[[Path, int, int], np.ndarray]  # (path, sample_rate, num_samples) -> audio

MAX_FILES = 100_000  # a folder holding more is a mistake, not a data set


@dataclass(frozen=True)
class Skipped:
    """A file or folder that is not used, and why."""

    path: Path
    reason: str


def shown(path: Path) -> str:
    """A path as one line of text for a log: bytes that are not UTF-8 as \\xff, control characters escaped."""
    return log_lines.escape(os.fsencode(path).decode("utf-8", "backslashreplace"))


def unusable(path: Path) -> str | None:
    """Why a file or folder cannot be used whatever it holds (its name, a link to nowhere), or None."""
    try:
        path.name.encode()
    except UnicodeEncodeError:  # Python holds the bytes that are not UTF-8 as surrogates
        return "its name is not UTF-8: rename it"
    if log_lines.escape(path.name) != path.name:
        return "its name holds a control character (a newline, a tab): rename it"
    if path.is_symlink() and not path.exists():
        return "a symbolic link to nothing, or a loop of links"
    return None


def is_test(relative: str) -> bool:
    """Whether the file at this path (relative to its data folder) is in the test split.

    A hash of the path decides, so the split survives restarts and new files never move old ones.
    """
    digest = hashlib.sha256(relative.encode(errors="surrogateescape")).digest()  # the name's own bytes
    return int.from_bytes(digest[:8], "big") < TEST_FRACTION * 2**64


def _listed(folder: Path, skipped: list[Skipped]) -> list[Path]:
    """The entries of a folder, sorted; none, and a skip saying why, if it cannot be listed."""
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        skipped.append(Skipped(folder, f"cannot list it ({exc.strerror or exc})"))
        return []


def list_folder(
    root: Path, labels: Sequence[str], negatives: Sequence[str] = ()
) -> tuple[list[Clip], list[Skipped]]:
    """Every file in root/<label>/ for the task's labels, sorted; what is not in a label folder is skipped.

    A task with a none class but no `_unknown_` label trains root/_unknown_/ (Speech Commands' folder of
    other words) as its none class.

    Hidden files (a name starting with '.') are passed over silently: half-written recordings live there;
    so are a corpus' notes beside the label folders (SOURCE.md, README.md, LICENSE), and the task's
    negatives, which are read on their own (list_negative). So is anything with an unusable name or a
    label folder that cannot be listed, with the reason. FileNotFoundError if root is not a folder,
    OSError if it cannot be listed.
    """
    passed_over = {Path(negative).parts[0] for negative in negatives}
    index = {name: i for i, name in enumerate(labels)}
    if (other := other_speech_class(labels)) is not None:  # other words train the none class
        index.setdefault(UNKNOWN_LABEL, other)
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no data folder {shown(root)}")
    clips: list[Clip] = []
    skipped: list[Skipped] = []
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise OSError(f"cannot list the data folder {shown(root)}: {exc.strerror or exc}") from None
    for entry in entries:
        if entry.name.startswith(".") or entry.name in passed_over:
            continue
        if reason := unusable(entry):
            skipped.append(Skipped(entry, reason))
        elif not entry.is_dir():
            if not entry.name.endswith(".md") and not entry.name.startswith("LICENSE"):  # a corpus' notes
                skipped.append(Skipped(entry, "not inside a label folder"))
        elif entry.name not in index:
            skipped.append(Skipped(entry, f"folder {entry.name!r} is not a label of the task"))
        else:
            label = index[entry.name]
            for path in _listed(entry, skipped):
                if path.name.startswith("."):
                    continue
                if reason := unusable(path):
                    skipped.append(Skipped(path, reason))
                elif not path.is_file():
                    skipped.append(Skipped(path, "not a regular file"))
                elif len(clips) >= MAX_FILES:
                    skipped.append(Skipped(path, f"more than {MAX_FILES} files in the folder"))
                else:
                    clips.append(Clip(path, label, "", is_test(path.relative_to(root).as_posix())))
    return clips, skipped


def list_negative(root: Path, negative: str) -> tuple[list[Path], list[Skipped]]:
    """The files of one of a task's negatives, root/negative: a folder's files, sorted, or one file.

    FileNotFoundError if it does not exist; ValueError unless it resolves inside root (symlinks followed).
    Hidden files, and files not named as audio soundfile reads (a folder's notes, its license), are
    passed over; what is not a regular file, or has an unusable name, is skipped, as is a folder that
    cannot be listed.
    """
    path = Path(root) / negative
    if not path.exists():
        raise FileNotFoundError(f"no {path}")
    resolved, inside = path.resolve(), Path(root).resolve()
    if resolved == inside or not resolved.is_relative_to(inside):
        raise ValueError(f"{path} is not inside the data folder {root}")
    if path.is_file():
        return [path], []
    audio = {f".{kind.lower()}" for kind in soundfile.available_formats()}
    files: list[Path] = []
    skipped: list[Skipped] = []
    for entry in _listed(path, skipped):
        if entry.name.startswith(".") or entry.suffix.lower() not in audio:
            continue
        if reason := unusable(entry):
            skipped.append(Skipped(entry, reason))
        elif not entry.is_file():
            skipped.append(Skipped(entry, "not a regular file"))
        elif len(files) >= MAX_FILES:
            skipped.append(Skipped(entry, f"more than {MAX_FILES} files in the folder"))
        else:
            files.append(entry)
    return files, skipped


class ClipCache:
    """Clips read once per version of a file (its size and mtime); bad files are remembered with why,
    but for those that cannot be opened, tried again each time.

    read turns a file into its audio: load_audio (one clip), or another Reader such as a file's windows.
    """

    def __init__(self, read: Reader = load_audio) -> None:
        self._read = read
        self._audio: dict[tuple, np.ndarray | str] = {}

    def load(
        self, clips: Sequence[Clip], sample_rate: int, num_samples: int
    ) -> tuple[list[Clip], np.ndarray, list[Skipped]]:
        """(clips that loaded, their (N, num_samples) waveforms, skips of files not tried before)."""
        kept, rows, fresh = self.read(clips, sample_rate, num_samples)
        waveforms = np.stack(rows) if rows else np.zeros((0, num_samples), dtype=np.float32)
        return kept, waveforms, fresh

    def read(
        self, clips: Sequence[Clip], sample_rate: int, num_samples: int
    ) -> tuple[list[Clip], list[np.ndarray], list[Skipped]]:
        """(clips that loaded, the audio of each as read gives it, skips of files not tried before)."""
        kept, rows, fresh = [], [], []
        seen = set()
        for clip in clips:
            try:
                stat = clip.path.stat()
                key = (str(clip.path), stat.st_size, stat.st_mtime_ns, sample_rate, num_samples)
            except OSError as exc:
                fresh.append(Skipped(clip.path, f"cannot read it ({exc.strerror})"))
                continue
            seen.add(key)
            if key not in self._audio:
                try:
                    os.close(os.open(clip.path, os.O_RDONLY | os.O_NONBLOCK))  # its mode may forbid it
                    self._audio[key] = self._read(clip.path, sample_rate, num_samples)
                except AudioError as exc:
                    reason = str(exc).removeprefix(f"{clip.path}: ")
                    self._audio[key] = reason
                    fresh.append(Skipped(clip.path, reason))
                except OSError as exc:  # tried again next time: its mode may change, not its mtime
                    fresh.append(Skipped(clip.path, f"cannot read it ({exc.strerror or exc})"))
                    continue
            audio = self._audio[key]
            if isinstance(audio, np.ndarray):
                kept.append(clip)
                rows.append(audio)
        # forget files that were deleted or changed, so the cache holds what the folder holds
        shape = (sample_rate, num_samples)
        self._audio = {k: v for k, v in self._audio.items() if k in seen or k[3:] != shape}
        return kept, rows, fresh
