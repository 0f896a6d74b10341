"""A folder of one's own recordings, `DIR/<label>/*`, as labelled clips with a train/test split per file."""

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedspeech.models.datasets import TEST_FRACTION, AudioError, Clip, load_audio

MAX_FILES = 100_000  # a folder holding more is a mistake, not a data set


@dataclass(frozen=True)
class Skipped:
    """A file or folder that is not used, and why."""

    path: Path
    reason: str


def is_test(relative: str) -> bool:
    """Whether the file at this path (relative to its data folder) is in the test split.

    A hash of the path decides, so the split survives restarts and new files never move old ones.
    """
    digest = hashlib.sha256(relative.encode()).digest()
    return int.from_bytes(digest[:8], "big") < TEST_FRACTION * 2**64


def list_folder(root: Path, labels: Sequence[str]) -> tuple[list[Clip], list[Skipped]]:
    """Every file in root/<label>/ for the task's labels, sorted; what is not in a label folder is skipped.

    Hidden files (a name starting with '.') are passed over silently: half-written recordings live there.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no data folder {root}")
    clips: list[Clip] = []
    skipped: list[Skipped] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if not entry.is_dir():
            skipped.append(Skipped(entry, "not inside a label folder"))
        elif entry.name not in labels:
            skipped.append(Skipped(entry, f"folder {entry.name!r} is not a label of the task"))
        else:
            label = labels.index(entry.name)
            for path in sorted(entry.iterdir()):
                if path.name.startswith("."):
                    continue
                if not path.is_file():
                    skipped.append(Skipped(path, "not a regular file"))
                elif len(clips) >= MAX_FILES:
                    skipped.append(Skipped(path, f"more than {MAX_FILES} files in the folder"))
                else:
                    clips.append(Clip(path, label, "", is_test(path.relative_to(root).as_posix())))
    return clips, skipped


class ClipCache:
    """Clips loaded once per version of a file (its size and mtime); bad files are remembered with why."""

    def __init__(self) -> None:
        self._audio: dict[tuple, np.ndarray | str] = {}

    def load(
        self, clips: Sequence[Clip], sample_rate: int, num_samples: int
    ) -> tuple[list[Clip], np.ndarray, list[Skipped]]:
        """(clips that loaded, their (N, num_samples) waveforms, skips of files not tried before)."""
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
                    self._audio[key] = load_audio(clip.path, sample_rate, num_samples)
                except AudioError as exc:
                    reason = str(exc).removeprefix(f"{clip.path}: ")
                    self._audio[key] = reason
                    fresh.append(Skipped(clip.path, reason))
            audio = self._audio[key]
            if isinstance(audio, np.ndarray):
                kept.append(clip)
                rows.append(audio)
        # forget files that were deleted or changed, so the cache holds what the folder holds
        shape = (sample_rate, num_samples)
        self._audio = {k: v for k, v in self._audio.items() if k in seen or k[3:] != shape}
        waveforms = np.stack(rows) if rows else np.zeros((0, num_samples), dtype=np.float32)
        return kept, waveforms, fresh
