"""Which of a task's labels are words: names wrapped in underscores are not (no word, noise, others).

Speech Commands names its "no keyword" classes `_silence_` and `_unknown_`; a task with negatives gets
NONE_LABEL for the clips that are no word of it. A listener never reports these as detections, and
training puts background windows in the task's none class.
"""

from collections.abc import Mapping, Sequence

NONE_LABEL = "_none_"  # the class of a task's negatives: noise, other words, anything it does not know
SILENCE_LABEL = "_silence_"  # Speech Commands' class of background noise
UNKNOWN_LABEL = "_unknown_"  # Speech Commands' class of other words


def is_word(label: str) -> bool:
    """Whether a label names something to detect: not `_like_this_`."""
    return not (len(label) > 1 and label.startswith("_") and label.endswith("_"))


def none_class(labels: Sequence[str]) -> int | None:
    """The index of the class background windows are trained as: NONE_LABEL, else SILENCE_LABEL, else None."""
    for name in (NONE_LABEL, SILENCE_LABEL):
        if name in labels:
            return list(labels).index(name)
    return None


def other_speech_class(labels: Sequence[str]) -> int | None:
    """The index of the class speech that is no command is trained as: UNKNOWN_LABEL, else NONE_LABEL."""
    for name in (UNKNOWN_LABEL, NONE_LABEL):
        if name in labels:
            return list(labels).index(name)
    return None


def word_classes(labels: Sequence[str]) -> list[int]:
    """The indices of the labels that are words."""
    return [i for i, label in enumerate(labels) if is_word(label)]


def spoken(label: str, say: Mapping[str, str]) -> str:
    """How a label is said: the task's `say` for it, else its name with '_' and '-' as spaces."""
    return say.get(label) or " ".join(label.replace("_", " ").replace("-", " ").split())
