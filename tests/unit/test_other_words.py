"""Speech that is no command: the bundled list of common words, less a task's words and those that sound
like them, by espeak-ng's phonemes where it is installed and by spelling where not; and a device's own
folder of other words, `_unknown_`.
"""

import shutil

import pytest

from fedspeech.models.clips import other_words as other
from fedspeech.models.clips.folders import list_folder
from fedspeech.models.clips.other_words import bundled_words, distance, other_words, phonemes, sounds_like
from fedspeech.models.clips.tasks import BUILTIN_TASKS
from tests.helpers.recordings import copy_takes

needs_espeak = pytest.mark.skipif(not shutil.which("espeak-ng"), reason="needs espeak-ng")

DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def test_the_bundled_list_is_thousands_of_distinct_lowercase_words():
    words = bundled_words()
    assert len(words) == len(set(words)) == 5000
    assert all(w.replace("'", "").isalpha() and w == w.lower() and len(w) > 1 for w in words)
    assert words[:3] == ("the", "to", "and")  # the commonest first


def test_distance_counts_insertions_deletions_and_substitutions():
    assert distance("kitten", "sitting") == 3
    assert distance(("w", "V", "n"), ("w", "0", "n")) == 1
    assert distance((), ("a", "b")) == 2 and distance("same", "same") == 0


@pytest.mark.parametrize(
    ("word", "command", "alike"),
    [
        (("w", "V", "n"), ("w", "0", "n"), True),  # won, one: one phoneme apart
        (("s", "V", "m", "w", "0", "n"), ("w", "0", "n"), True),  # someone holds one
        (("f", "o@", "t", "i"), ("f", "o@"), True),  # forty holds four
        (("t", "eI", "b", "@L"), ("w", "0", "n"), False),  # table
        (("h", "a", "p", "i"), ("s", "E", "v", "@", "n"), False),  # happy, seven
    ],
)
def test_sounds_like_is_near_or_holding(word, command, alike):
    assert sounds_like(word, command) is alike


@needs_espeak
def test_homophones_and_words_holding_a_command_are_left_out_by_their_sound():
    words = ["won", "too", "for", "ate", "someone", "fine", "table", "happy", "window", "zero"]
    assert other_words(DIGITS, words) == ["table", "happy", "window"]


@needs_espeak
def test_phonemes_come_one_per_text_even_for_phrases_and_dots():
    said = phonemes(["lights on", "a.m", "hello"])
    assert said is not None and len(said) == 3
    assert all(said) and "'" not in "".join(p for line in said for p in line)


def test_without_espeak_spelling_stands_in(monkeypatch):
    monkeypatch.setattr(other.shutil, "which", lambda name: None)
    assert phonemes(["one"]) is None
    kept = other_words(["one", "stop"], ["ones", "money", "stops", "table", "won", "spot"])
    assert kept == [
        "table",
        "won",
        "spot",
    ]  # spelled two letters from 'one' and 'stop', 'won' and 'spot' stay


def test_a_folder_of_other_words_trains_the_none_class_of_a_task_that_has_one(tmp_path):
    folder = copy_takes(tmp_path / "data", "01", range(2))
    (folder / "_unknown_").mkdir()
    shutil.copyfile(folder / "0" / "0_jackson_0.flac", folder / "_unknown_" / "other.flac")
    digits = BUILTIN_TASKS["fsdd"].labels  # the digits and _none_
    clips, skipped = list_folder(folder, digits)
    assert [digits[c.label] for c in clips if c.path.name == "other.flac"] == ["_none_"] and not skipped
    commands = BUILTIN_TASKS["speech_commands"].labels  # _unknown_ is a label of its own
    assert list_folder(folder, ["0", *commands])[0][-1].label == commands.index("_unknown_") + 1
    clips, skipped = list_folder(folder, ["0", "1"])  # no none class: nothing to train them as
    assert len(clips) == 4
    assert [s.reason for s in skipped] == ["folder '_unknown_' is not a label of the task"]
