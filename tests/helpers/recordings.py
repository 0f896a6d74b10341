"""Data folders of one's own recordings, made from the bundled FSDD takes."""

import shutil
from pathlib import Path

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
