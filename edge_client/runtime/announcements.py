"""Which model announcement is worth fetching: rounds only move forward, one rule for the listener's
follower and the daemon's keeper.

An announcement of the newest round held or on its way is no news, an older one is most likely a replay;
only a newer round is wanted.
"""

import enum

from fedspeech.protocol.messages import ModelAnnouncement


class Standing(enum.Enum):
    """An announcement's round against the newest round held or on its way."""

    NEWER = "newer"  # wanted
    SAME = "same"  # held already or on its way
    OLDER = "older"  # an old announcement replayed, most likely


def standing_of(
    announcement: ModelAnnouncement, held_round: int, wanted: ModelAnnouncement | None
) -> tuple[Standing, int]:
    """The standing of announcement against the newest round held or wanted, and that round (-1: none)."""
    newest = max(held_round, wanted.round if wanted else -1)
    if announcement.round == newest:
        return Standing.SAME, newest
    if announcement.round < newest:
        return Standing.OLDER, newest
    return Standing.NEWER, newest
