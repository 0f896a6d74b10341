"""Speech that is no command: common English words, less a task's words and those that sound like them.

A listener's none class must hear ordinary speech, or every word said near it sounds like a command. The
words are the bundled list (data/other_words, from wordfreq, with its SOURCE.md and LICENSE). Two words
sound alike when their phonemes, as espeak-ng says them, differ by at most one phoneme for every three,
or when one holds the other's phonemes in a row ("someone" holds "one", "forty" holds "four"). Without
espeak-ng, their spellings are compared the same way.
"""

import shutil
import subprocess
from collections.abc import Sequence
from functools import cache

from fedspeech.models.clips.datasets import bundled_data_dir

WORDS_FILE = "other_words/words.txt"  # in the bundled data
TIMEOUT_S = 60.0  # espeak-ng saying the phonemes of the whole list


@cache
def bundled_words() -> tuple[str, ...]:
    """The bundled list of common English words, the commonest first."""
    text = (bundled_data_dir() / WORDS_FILE).read_text(encoding="utf-8")
    return tuple(word for word in text.split() if word)


def phonemes(texts: Sequence[str]) -> list[tuple[str, ...]] | None:
    """Each text's phonemes as espeak-ng says them (stress left out); None without a working espeak-ng."""
    if not texts or shutil.which("espeak-ng") is None:
        return None if texts else []
    lines = "".join(f"{' '.join(text.replace('.', ' ').split())}.\n" for text in texts)
    try:
        done = subprocess.run(
            ["espeak-ng", "-q", "-x", "--sep=_", "--stdin"],
            input=lines.encode(),
            capture_output=True,
            timeout=TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    said = done.stdout.decode(errors="replace").splitlines()
    if len(said) != len(texts):  # a text espeak-ng split into clauses: the lines no longer match
        return None
    unstressed = (line.replace("'", "").replace(",", "").replace(" ", "_") for line in said)
    return [tuple(p for p in line.split("_") if p) for line in unstressed]


def distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two sequences: insertions, deletions and substitutions."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def sounds_like(word: Sequence[str], command: Sequence[str]) -> bool:
    """Whether a word's phonemes (or letters) are near a command's: one change for every three, or either
    holding the other in a row.
    """
    shorter, longer = sorted((tuple(word), tuple(command)), key=len)
    if any(longer[i : i + len(shorter)] == shorter for i in range(len(longer) - len(shorter) + 1)):
        return True
    return distance(word, command) <= max(1, len(command) // 3)


def other_words(commands: Sequence[str], words: Sequence[str] | None = None) -> list[str]:
    """The words (default: the bundled list) that are none of the commands and sound like none of them."""
    words = list(bundled_words() if words is None else words)
    said = phonemes([*commands, *words])
    if said is None:  # no espeak-ng: spelling stands in for sound
        said = [tuple(text.replace(" ", "")) for text in [*commands, *words]]
    spoken_commands, spoken_words = said[: len(commands)], said[len(commands) :]
    return [
        word
        for word, sound in zip(words, spoken_words, strict=True)
        if not any(sounds_like(sound, command) for command in spoken_commands)
    ]
