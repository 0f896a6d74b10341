"""Task files, the built-in tasks, and data folders of one's own recordings."""

import numpy as np
import pytest
import soundfile

from fedspeech.models.clips.folders import ClipCache, is_test, list_folder
from fedspeech.models.clips.tasks import BUILTIN_TASKS, TaskFileError, load_task, spec_for
from tests.helpers.recordings import copy_takes
from tests.helpers.task_files import GOOD


def test_task_file_and_its_model(tmp_path):
    path = tmp_path / "commands.toml"
    path.write_text(GOOD)
    task = load_task(path)
    assert (task.name, task.labels, task.sample_rate, task.num_samples) == (
        "commands",
        ["yes", "no", "up"],
        16000,
        24000,
    )
    spec = spec_for(task, "transformer")
    assert (spec.sample_rate, spec.num_samples, spec.num_classes, spec.depth) == (16000, 24000, 3, 4)


def test_builtin_tasks_one_per_corpus():
    assert load_task("emodb").clip_seconds == 3.0 and len(load_task("emodb").labels) == 7
    assert load_task("fsdd").sample_rate == 8000 and load_task("speech_commands").labels[-1] == "_silence_"
    assert set(BUILTIN_TASKS) == {"fsdd", "emodb", "speech_commands"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sample_rate": "sample_rate = 100"}, "key sample_rate: must be between 4000 and 48000"),
        ({"clip_seconds": 'clip_seconds = "long"'}, "key 'clip_seconds' must be a number"),
        ({"clip_seconds": "clip_seconds = 60"}, "key clip_seconds: must be between"),
        ({"labels": 'labels = ["yes", "yes"]'}, "key labels: repeated ['yes']"),
        ({"labels": 'labels = ["yes", "../etc"]'}, "is not a folder name"),
        ({"labels": 'labels = ["sí", "no"]'}, "'sí' is not a folder name (ASCII letters, digits"),
        ({"labels": 'labels = ["yes"]'}, "between 2 and 64 are needed"),
        ({"labels": "labels = [1, 2]"}, "key 'labels' must be a list of strings"),
        ({"name": ""}, "key 'name' is missing"),
        ({"name": 'name = "x"\nwindow = 3'}, "unknown key 'window'"),
        ({"name": "name = "}, "not valid TOML"),
    ],
)
def test_a_bad_task_file_names_the_key_and_the_problem(tmp_path, change, message):
    lines = {line.split(" =")[0]: line for line in GOOD.splitlines()} | change
    path = tmp_path / "task.toml"
    path.write_text("\n".join(lines.values()))
    with pytest.raises(TaskFileError, match=None) as error:
        load_task(path)
    assert message in str(error.value) and str(error.value).startswith(str(path))


def _folder(tmp_path):
    return copy_takes(tmp_path / "data", "01", range(10))


def test_folder_skips_what_is_not_a_usable_clip_of_a_label(tmp_path):
    root = _folder(tmp_path)
    (root / "0" / "corrupt.wav").write_bytes(b"RIFF....WAVEfmt garbage")
    (root / "0" / "empty.flac").write_bytes(b"")
    soundfile.write(root / "1" / "silent.wav", np.zeros(8000, dtype=np.float32), 8000)
    soundfile.write(root / "1" / "long.wav", np.full(8000 * 40, 0.1, dtype=np.float32), 8000)
    (root / "1" / ".recording.flac.tmp").write_bytes(b"half a take")
    (root / "cats").mkdir()
    (root / "readme.txt").write_text("my recordings")
    labels = [str(d) for d in range(10)]
    clips, skipped = list_folder(root, labels)
    assert {s.path.name: s.reason for s in skipped} == {
        "cats": "folder 'cats' is not a label of the task",
        "readme.txt": "not inside a label folder",
    }
    kept, waveforms, bad = ClipCache().load(clips, 8000, 8000)
    reasons = {s.path.name: s.reason for s in bad}
    assert reasons["corrupt.wav"].startswith("unreadable or corrupt audio")
    assert reasons["empty.flac"] == "empty file"
    assert reasons["silent.wav"] == "silent"
    assert reasons["long.wav"] == "40.0 s long, more than 30 s"
    assert len(kept) == 20 and waveforms.shape == (20, 8000)
    assert sorted({c.label for c in kept}) == [0, 1]


def test_split_is_per_file_and_survives_new_files(tmp_path):
    root = _folder(tmp_path)
    labels = [str(d) for d in range(10)]
    before = {c.path.name: c.test for c in list_folder(root, labels)[0]}
    assert 0 < sum(before.values()) < len(before)
    copy_takes(root, "0", range(10, 50))
    after = {c.path.name: c.test for c in list_folder(root, labels)[0]}
    assert {name: after[name] for name in before} == before
    assert 0.1 < np.mean(list(after.values())) < 0.3  # about a fifth of the files are held out
    assert is_test("0/0_jackson_3.flac") == before["0_jackson_3.flac"]


def test_cache_reads_a_changed_file_again(tmp_path):
    root = _folder(tmp_path)
    cache = ClipCache()
    clips, _ = list_folder(root, ["0", "1"])
    kept, first, _ = cache.load(clips, 8000, 8000)
    target = root / "0" / "0_jackson_0.flac"
    soundfile.write(target, np.zeros(100, dtype=np.float32), 8000)  # re-recorded, badly
    kept_again, _, bad = cache.load(clips, 8000, 8000)
    assert len(kept_again) == len(kept) - 1 and [s.path for s in bad] == [target]
    assert cache.load(clips, 8000, 8000)[2] == [], "a bad file is reported once"
