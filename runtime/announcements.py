"""Which model announcement is worth fetching: rounds only move forward, one rule for the listener's
follower and the daemon's keeper.

An announcement of the newest round held or on its way is no news, an older one is most likely a replay;
only a newer round is wanted. Nor is any round below the floor: the newest round the coordinator was seen
to announce, kept in a small JSON file across restarts, so that a process that just started does not take
an old announcement replayed on the broker for the latest.
"""

import enum
import json
import logging
from pathlib import Path

from fedspeech.protocol.files import write_atomically
from fedspeech.protocol.messages import ModelAnnouncement

log = logging.getLogger(__name__)

FLOOR_FILE = "model-floor.json"
MAX_FLOOR_BYTES = 4096


class Standing(enum.Enum):
    """An announcement's round against the newest round held or on its way, and the floor."""

    NEWER = "newer"  # wanted
    SAME = "same"  # held already or on its way
    OLDER = "older"  # an old announcement replayed, most likely


def standing_of(
    announcement: ModelAnnouncement, held_round: int, wanted: ModelAnnouncement | None, floor: int = -1
) -> tuple[Standing, int]:
    """The standing of announcement against the newest round held or wanted and the floor, and the newest
    round of these (-1: none).
    """
    newest = max(held_round, wanted.round if wanted else -1)
    if announcement.round < max(newest, floor):
        return Standing.OLDER, max(newest, floor)
    if announcement.round == newest:
        return Standing.SAME, newest
    return Standing.NEWER, newest


def worth_fetching(
    announcement: ModelAnnouncement, held_round: int, wanted: ModelAnnouncement | None, floor: "Floor"
) -> bool:
    """Whether a verified announcement's model is to be fetched: newer than the round held, the one on its
    way and the floor, with an ONNX model. The floor is raised to it unless it is older; why not is logged.
    """
    standing, newest = standing_of(announcement, held_round, wanted, floor.round)
    if standing is Standing.OLDER:
        log.warning(
            "round %d: ignoring it, round %d is newer (an old announcement replayed? if the coordinator "
            "started over, remove %s)",
            announcement.round, newest, floor.path,
        )  # fmt: skip
        return False
    floor.raise_to(announcement)
    if announcement.onnx is None:
        log.info("round %d: ignoring it, it has no ONNX model", announcement.round)
        return False
    if standing is Standing.SAME:
        log.info("round %d: its model is held already or on its way", newest)
        return False
    return True


class Floor:
    """The newest round a coordinator (its key, its model topic) was seen to announce; kept in path if any.

    A file of another key or topic, or one that cannot be read, is a floor of -1 (logged). A file that
    cannot be written keeps the floor in memory only (logged).
    """

    def __init__(self, path: Path | None, key: str, topic: str) -> None:
        self.path, self.key, self.topic = path, key, topic
        self.round, self.issued_at = -1, 0.0
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            with open(path, "rb") as f:
                kept = json.loads(f.read(MAX_FLOOR_BYTES))
            if kept["key"] != self.key or kept["topic"] != self.topic:
                log.info("%s is another coordinator's floor: starting from none", path)
                return
            round, issued_at = kept["round"], kept["issued_at"]
            if not isinstance(round, int) or not isinstance(issued_at, int | float):
                raise ValueError("not a round and a time")
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("cannot read the floor in %s (%s): starting from none", path, exc)
            return
        self.round, self.issued_at = round, float(issued_at)

    def raise_to(self, announcement: ModelAnnouncement) -> None:
        """Raise the floor to a verified announcement's round if it is higher, and keep it."""
        if announcement.round <= self.round:
            return
        self.round, self.issued_at = announcement.round, announcement.issued_at
        if self.path is None:
            return
        kept = {"round": self.round, "issued_at": self.issued_at, "key": self.key, "topic": self.topic}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps(kept).encode())
        except OSError as exc:
            log.warning("cannot keep the floor of round %d in %s: %s", self.round, self.path, exc)
