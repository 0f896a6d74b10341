"""Bad files never stop a device: a name that is not UTF-8 or holds a newline, in its data folder at start
or dropped there while it runs, is skipped with one line naming it; the device trains on its other files.
The device daemon against the machine's Mosquitto and the coordinator double."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedspeech.edge_client import DataSource
from fedspeech.models.clips.datasets import bundled_data_dir
from fedspeech.protocol import weights
from tests.helpers.device_doubles import (
    SPEAKER,
    CoordinatorDouble,
    Fleet,
    fleet_of,
    make_task,
    running_daemon,
    wait_until,
    warnings_about,
)
from tests.helpers.recordings import copy_takes

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    from fedspeech.models import build_model
    from fedspeech.models.train import get_arrays
    from tests.helpers.device_doubles import SPEC

    blob = weights.encode(get_arrays(build_model(SPEC)))
    with fleet_of(CoordinatorDouble(blob), tmp_path / "device-state") as fleet:
        yield fleet


def _drop(folder: Path, name: bytes) -> None:
    """A good recording under a name given as bytes, as a file system holds it."""
    clip = (bundled_data_dir() / "fsdd" / "recordings" / f"9_{SPEAKER}_9.flac").read_bytes()
    with open(os.fsencode(folder) + b"/" + name, "wb") as f:
        f.write(clip)


def _trained_on(upload) -> int:
    return int(weights.decode(upload.body)[1]["num_samples"])


def test_a_name_that_is_not_utf8_is_skipped_at_start_with_one_line(fleet: Fleet, tmp_path, caplog) -> None:
    folder = tmp_path / "data"
    copy_takes(folder, "012", range(4), SPEAKER)
    _drop(folder / "0", b"\xff\xfe.wav")  # Latin-1, or a copy from another machine
    coordinator = fleet.coordinator
    with running_daemon(fleet, data=DataSource(folder=folder), max_samples=None):  # it starts
        fleet.send_task(make_task("task-1", blob=coordinator.blob))
        wait_until(lambda: coordinator.uploads)  # and trains
    lines = warnings_about(caplog, "\\xff\\xfe.wav")
    assert [r.getMessage() for r in lines] == [
        f"skipping {folder}/0/\\xff\\xfe.wav: its name is not UTF-8: rename it"
    ]
    assert len(warnings_about(caplog, "skipping")) == 1, "nothing else is skipped"
    status = [s for s in fleet.statuses() if s.state == "online"][-1]
    assert sum(status.train_counts.values()) + sum(status.test_counts.values()) == 12
    assert _trained_on(coordinator.uploads[0]) == sum(status.train_counts.values())


def test_odd_names_dropped_in_while_it_runs_fail_no_task(fleet: Fleet, tmp_path, caplog) -> None:
    folder = tmp_path / "data"
    copy_takes(folder, "012", range(4), SPEAKER)
    coordinator = fleet.coordinator
    with running_daemon(fleet, data=DataSource(folder=folder), max_samples=None):
        fleet.send_task(make_task("task-1", blob=coordinator.blob))
        wait_until(lambda: coordinator.uploads)
        _drop(folder / "1", b"caf\xe9.wav")
        _drop(folder / "2", b"two\nlines.wav")
        os.mkdir(os.fsencode(folder) + b"/\xe9t\xe9")
        for number in (2, 3):  # every task after it trains, and the files are named once
            fleet.send_task(make_task(f"task-{number}", blob=coordinator.blob))
            wait_until(lambda n=number: len(coordinator.uploads) == n)
    assert [u.task_id for u in coordinator.uploads] == ["task-1", "task-2", "task-3"]
    assert not warnings_about(caplog, "dropping task") and not warnings_about(caplog, "failed")
    assert sorted(r.getMessage() for r in warnings_about(caplog, "skipping")) == [
        f"skipping {folder}/1/caf\\xe9.wav: its name is not UTF-8: rename it",
        f"skipping {folder}/2/two\\nlines.wav: its name holds a control character (a newline, a tab): "
        "rename it",
        f"skipping {folder}/\\xe9t\\xe9: its name is not UTF-8: rename it",
    ]
    assert _trained_on(coordinator.uploads[2]) == _trained_on(coordinator.uploads[0]), "the same clips"
