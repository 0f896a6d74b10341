"""A device's data folder with odd things in it: names that are not UTF-8 or hold a newline, links to
nowhere and loops of links, files and folders that cannot be read. Each is skipped with one line naming it;
the other files are used. Real files in a temporary folder."""

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fedspeech.edge_client.local_data import DataSource, LocalData
from fedspeech.models.clips.datasets import TEST_FRACTION, bundled_data_dir
from fedspeech.models.clips.folders import ClipCache, is_test, list_folder, list_negative, shown
from fedspeech.models.clips.tasks import BUILTIN_TASKS
from tests.helpers.recordings import copy_takes

FSDD = BUILTIN_TASKS["fsdd"]
RECORDINGS = bundled_data_dir() / "fsdd" / "recordings"


def _odd_folder(tmp_path: Path) -> Path:
    """A data folder of 3 good takes of 0 and 1, and one of each odd thing."""
    folder = tmp_path / "data"
    copy_takes(folder, "01", range(3))
    clip = (RECORDINGS / "0_jackson_9.flac").read_bytes()
    with open(os.fsencode(folder / "0") + b"/\xff\xfe.flac", "wb") as f:  # not UTF-8: Latin-1 or worse
        f.write(clip)
    (folder / "1" / "two\nlines.flac").write_bytes(clip)
    (folder / "0" / "loop.flac").symlink_to(folder / "0" / "loop.flac")  # a loop of links
    (folder / "1" / "gone.flac").symlink_to(tmp_path / "nowhere.flac")
    (folder / "2").symlink_to(folder / "2")  # a label folder that is a loop of links
    os.mkdir(os.fsencode(folder) + b"/\xe9t\xe9")  # a folder whose name is not UTF-8
    return folder


def test_odd_names_and_links_are_skipped_with_the_reason_and_the_rest_is_listed(tmp_path):
    folder = _odd_folder(tmp_path)
    clips, skipped = list_folder(folder, FSDD.labels)
    assert sorted(c.path.name for c in clips) == [f"{d}_jackson_{t}.flac" for d in "01" for t in range(3)]
    reasons = {shown(s.path.relative_to(folder)): s.reason for s in skipped}
    assert reasons == {
        "0/\\xff\\xfe.flac": "its name is not UTF-8: rename it",
        "1/two\\nlines.flac": "its name holds a control character (a newline, a tab): rename it",
        "0/loop.flac": "a symbolic link to nothing, or a loop of links",
        "1/gone.flac": "a symbolic link to nothing, or a loop of links",
        "2": "a symbolic link to nothing, or a loop of links",
        "\\xe9t\\xe9": "its name is not UTF-8: rename it",
    }


def _decided_from_bytes(name: str) -> bool:
    """The split as is_test documents it: a hash of the name's bytes as the file system holds them."""
    digest = hashlib.sha256(os.fsencode(name)).digest()
    return int.from_bytes(digest[:8], "big") < TEST_FRACTION * 2**64


def test_the_split_of_a_name_is_decided_from_its_bytes():
    # names that are not UTF-8 arrive as surrogate escapes: b"caf\xe9" is "caf\udce9", not "café"
    names = ["0/caf\udce9.wav", "0/\udcff\udcfe.flac", "0/café.wav", "0/a.wav"]
    names += [f"0/0_jackson_{take}.flac" for take in range(10)]
    decided = [_decided_from_bytes(name) for name in names]
    assert [is_test(name) for name in names] == decided
    assert set(decided) == {True, False}, "names of both splits"


def test_a_negative_folder_with_odd_names_gives_its_good_files(tmp_path):
    noise = tmp_path / "noise"
    noise.mkdir()
    clip = (RECORDINGS / "0_jackson_9.flac").read_bytes()
    (noise / "hum.flac").write_bytes(clip)
    with open(os.fsencode(noise) + b"/\xff.flac", "wb") as f:
        f.write(clip)
    files, skipped = list_negative(tmp_path, "noise")
    assert [f.name for f in files] == ["hum.flac"]
    assert [(shown(s.path.relative_to(tmp_path)), s.reason) for s in skipped] == [
        ("noise/\\xff.flac", "its name is not UTF-8: rename it")
    ]


def test_a_device_logs_one_line_for_each_odd_thing_and_loads_the_rest(tmp_path, caplog):
    folder = _odd_folder(tmp_path)
    data = LocalData(DataSource(folder=folder))
    caplog.set_level(logging.WARNING)
    data.refresh(FSDD)
    data.refresh(FSDD)  # scanned again for the next task: nothing new to say
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 6, lines
    assert f"skipping {folder}/0/\\xff\\xfe.flac: its name is not UTF-8: rename it" in lines
    assert f"skipping {folder}/1/two\\nlines.flac: its name holds a control character" in "".join(lines)
    assert all("\n" not in line and line.isprintable() for line in lines)
    total = sum(data.train.counts.values()) + sum(data.test.counts.values())
    assert total == 6 and set(data.train.counts) | set(data.test.counts) == {"0", "1"}


def test_a_file_that_goes_between_its_listing_and_its_reading_is_skipped(tmp_path):
    folder = tmp_path / "data"
    copy_takes(folder, "0", range(2))
    clips, _ = list_folder(folder, FSDD.labels)

    def vanishing(path: Path, sample_rate: int, num_samples: int) -> np.ndarray:
        path.unlink()  # as a user moving recordings about might
        return np.frombuffer(path.read_bytes(), dtype=np.float32)

    kept, _, skipped = ClipCache(vanishing).load(clips, 8000, 8000)
    assert kept == [] and [s.reason for s in skipped] == ["cannot read it (No such file or directory)"] * 2


UNREADABLE = """
import logging, sys
from pathlib import Path
from fedspeech.edge_client.local_data import DataSource, LocalData
from fedspeech.models.clips.tasks import BUILTIN_TASKS
logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
data = LocalData(DataSource(folder=Path(sys.argv[1])))
data.refresh(BUILTIN_TASKS["fsdd"])
data.refresh(BUILTIN_TASKS["fsdd"])
print(sum(data.train.counts.values()) + sum(data.test.counts.values()), "clips")
"""


def _without_root_powers() -> list[str]:
    """The command prefix that runs a process unable to read what its mode forbids, even as root."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root, and no setpriv to drop root's power to read any file")
    # root reads any file through these two capabilities: without them, a file's mode binds it too
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


def test_files_and_folders_that_cannot_be_read_are_skipped(tmp_path):
    folder = tmp_path / "data"
    copy_takes(folder, "012", range(3))
    (folder / "0" / "0_jackson_0.flac").chmod(0)
    (folder / "2").chmod(0)
    try:
        done = subprocess.run(
            [*_without_root_powers(), sys.executable, "-c", textwrap.dedent(UNREADABLE), str(folder)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        (folder / "2").chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"skipping {folder}/2: cannot list it (Permission denied)",
        f"skipping {folder}/0/0_jackson_0.flac: cannot read it (Permission denied)",
        "5 clips",
    ]
