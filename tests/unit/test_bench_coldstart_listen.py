"""`fedspeech bench coldstart --listen`: the task with a none class, the devices' other words, the unseen
speakers' stream, and the report's must-show."""

import json

import numpy as np

from fedspeech.models.clips.datasets import load_corpus
from fedspeech.protocol.labels import NONE_LABEL, UNKNOWN_LABEL, none_class, other_speech_class
from fedspeech_bench.coldstart_fleet import WORDS, build_fleet
from fedspeech_bench.coldstart_listen import (
    LISTEN_ARMS,
    TALK,
    ListenResult,
    heard_figures,
    listen_report,
    listen_sample,
    listen_task,
    own_clips,
    with_negatives,
)
from fedspeech_bench.listen_bench import OTHER_WORDS
from tests.helpers.shared_data import SHARED_DATA, needs_shared

NONE = len(WORDS)  # `_none_`, after the ten words


def test_the_task_is_the_ten_commands_and_one_none_class_for_noise_and_other_speech():
    task = listen_task()
    assert task.labels == [*WORDS, NONE_LABEL] and task.sample_rate == 16000
    assert none_class(task.labels) == other_speech_class(task.labels) == NONE
    assert task.negatives == ["_background_noise_"]


def test_a_device_adds_as_many_negative_windows_as_its_commonest_label_has_clips():
    clips = (np.zeros((7, 4), np.float32), np.array([0, 0, 0, 1, 2, 2, NONE]))
    negatives = np.arange(40, dtype=np.float32).reshape(10, 4)
    waveforms, labels = with_negatives(clips, negatives)
    assert len(waveforms) == len(labels) == 7 + 3 and list(labels[7:]) == [NONE] * 3
    assert {row.tobytes() for row in waveforms[7:]} <= {row.tobytes() for row in negatives}
    assert len(with_negatives(clips, negatives[:2])[1]) == 7 + 2  # fewer windows than that: all of them


@needs_shared
def test_the_devices_other_words_are_their_own_speakers_and_no_device_speaker_is_heard():
    fleet = build_fleet(SHARED_DATA, seed=0)
    corpus = load_corpus("speech_commands", SHARED_DATA)
    unknown = corpus.labels.index(UNKNOWN_LABEL)
    for n, group in enumerate(fleet.speakers):
        theirs = [c for c in corpus.clips if c.label == unknown and c.speaker in group]
        assert len(fleet.others[n]) == len(theirs)
        with_others, without = own_clips(fleet, n, True), own_clips(fleet, n, False)
        assert list(with_others[1]) == list(without[1]) + [NONE] * len(theirs)
        assert np.array_equal(without[0], fleet.devices[n][0])
    assert sum(len(o) for o in fleet.others) > 0
    held = {s for group in fleet.speakers for s in group}
    assert not held & {c.speaker for c in fleet.unseen}
    assert [WORDS.index(corpus.labels[c.label]) for c in fleet.unseen] == fleet.test[1].tolist()
    chosen = listen_sample(fleet, 0)
    assert len(set(chosen.tolist())) == len(chosen) == min(500, len(fleet.unseen))
    assert np.array_equal(chosen, listen_sample(fleet, 0))
    assert not np.array_equal(chosen, listen_sample(fleet, 1))


def _results_json(path, name, clean_hits, talk, other_words):
    results = [
        {"condition": "clean", "words": 100, "hits": clean_hits, "others": 0, "insertions": 0},
        {"condition": TALK, "words": 0, "others": 0, "insertions": 1, "false_per_hour": talk},
        {"condition": OTHER_WORDS, "words": 0, "others": 200, "insertions": other_words},
    ]
    path.write_text(json.dumps({"models": {name: {"results": results}}}))
    return path


def test_the_report_tests_the_must_show_on_each_arm(tmp_path):
    met, missed = LISTEN_ARMS[0].name, LISTEN_ARMS[1].name
    results = [
        ListenResult(
            met, 0, 0.85, 0.80, 0.4, "", heard_figures(_results_json(tmp_path / "a", met, 78, 2, 2), met)
        ),
        ListenResult(
            missed,
            0,
            0.85,
            0.80,
            0.3,
            "",
            heard_figures(_results_json(tmp_path / "b", missed, 70, 4, 3), missed),
        ),
    ]
    assert results[0].heard[OTHER_WORDS] == (1.0, "% of other words detected")
    text = listen_report(results, rounds=20, takes=100)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["clean: % detected in order"].endswith("| 78.0 | 70.0 |")
    assert rows["clip accuracy, the stream's clips (%)"].endswith("| 80.0 | 80.0 |")
    verdicts = {line.split(":")[0]: line for line in text.splitlines() if line.startswith("- ")}
    assert "-2.0 points from clip accuracy (met" in verdicts[f"- {met}"]
    assert "talk 2.0 an hour (met" in verdicts[f"- {met}"] and "1.0 % detected (met" in verdicts[f"- {met}"]
    assert "-10.0 points from clip accuracy (not met" in verdicts[f"- {missed}"]
    assert "talk 4.0 an hour (not met" in verdicts[f"- {missed}"]
    assert "1.5 % detected (not met" in verdicts[f"- {missed}"]
