"""Data folders of one's own recordings, and streams of held-out digits, made from the bundled FSDD takes."""

import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import soundfile

from fedspeech.models.clips.datasets import bundled_data_dir


def copy_takes(folder: Path, digits: str, takes: range, speaker: str = "jackson") -> Path:
    """Copy the speaker's takes of each digit into folder/<digit>/ under their own names; returns folder.

    A take is FSDD's <digit>_<speaker>_<take>.flac; the label folders are made as needed.
    """
    recordings = bundled_data_dir() / "fsdd" / "recordings"
    for digit in digits:
        (folder / digit).mkdir(parents=True, exist_ok=True)
        for take in takes:
            name = f"{digit}_{speaker}_{take}.flac"
            shutil.copyfile(recordings / name, folder / digit / name)
    return folder


FSDD_RATE = 8000


def held_out_digits(
    digits: Iterable[object], speaker: str, number: int, pause_s: float = 0.6
) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """A speaker's held-out takes of digits (FSDD's recordings 0-4), pause_s apart and around, at 8 kHz;
    and each take's span in seconds.
    """
    recordings = bundled_data_dir() / "fsdd" / "recordings"
    pause = np.zeros(round(pause_s * FSDD_RATE), np.float32)
    parts, spans, position = [pause], [], len(pause)
    for digit in digits:
        clip, rate = soundfile.read(recordings / f"{digit}_{speaker}_{number}.flac", dtype="float32")
        assert rate == FSDD_RATE
        spans.append((position / FSDD_RATE, (position + len(clip)) / FSDD_RATE))
        parts += [clip, pause]
        position += len(clip) + len(pause)
    return np.concatenate(parts), spans
