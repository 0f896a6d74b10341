"""Scoring a listener: the words it detected, in time order, aligned with the words spoken (Levenshtein).

Among the alignments with the fewest edits the one with the most hits is taken, so that "detected in
order" is never understated by an arbitrary tie-break (spoken a b, detected b a: one hit, not none).
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Alignment:
    """Counts of one alignment: spoken words detected, detected as another word, extra, and missed."""

    hits: int = 0
    substitutions: int = 0
    insertions: int = 0
    deletions: int = 0

    @property
    def words(self) -> int:
        """The number of words spoken."""
        return self.hits + self.substitutions + self.deletions

    @property
    def wrong_or_extra(self) -> int:
        """Detections that are not a spoken word in its place: substitutions and insertions."""
        return self.substitutions + self.insertions


def _key(a: Alignment) -> tuple[int, int]:
    """What an alignment minimises: first its edits, then its misses of hits."""
    return a.substitutions + a.insertions + a.deletions, -a.hits


def align(spoken: Sequence[str], detected: Sequence[str]) -> Alignment:
    """The alignment of the detected labels with the spoken ones with the fewest edits, then most hits."""
    # previous[j]: the best alignment of the spoken words so far with detected[:j]
    previous = [Alignment(insertions=j) for j in range(len(detected) + 1)]
    for i, word in enumerate(spoken, start=1):
        current = [Alignment(deletions=i)]
        for j, label in enumerate(detected, start=1):
            diagonal = previous[j - 1]
            if word == label:
                matched = replace(diagonal, hits=diagonal.hits + 1)
            else:
                matched = replace(diagonal, substitutions=diagonal.substitutions + 1)
            up, left = previous[j], current[j - 1]
            deleted = replace(up, deletions=up.deletions + 1)
            inserted = replace(left, insertions=left.insertions + 1)
            current.append(min((matched, deleted, inserted), key=_key))
        previous = current
    return previous[-1]
