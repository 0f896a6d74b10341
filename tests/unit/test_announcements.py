"""The newest-announcement rule the model follower and the model keeper share: rounds only move forward."""

import pytest

from fedspeech.edge_client.runtime.announcements import Standing, standing_of
from fedspeech.protocol.messages import BlobRef, ModelAnnouncement, ModelSpec

SPEC = ModelSpec("cnn", 8000, 8000, 10)


def announcement(round: int) -> ModelAnnouncement:
    """An announcement of round's model, its files made up."""
    blob = BlobRef(f"/api/models/{round}/weights", "0" * 64, 1)
    return ModelAnnouncement(round, SPEC, [str(d) for d in range(10)], blob, blob)


@pytest.mark.parametrize(
    ("announced", "held", "wanted", "expected"),
    [
        (0, -1, None, (Standing.NEWER, -1)),  # nothing held: round 0 is news
        (4, 3, None, (Standing.NEWER, 3)),
        (3, 3, None, (Standing.SAME, 3)),  # held already
        (2, 3, None, (Standing.OLDER, 3)),  # a replay
        (6, 3, 5, (Standing.NEWER, 5)),  # newer than the one on its way replaces it
        (5, 3, 5, (Standing.SAME, 5)),  # on its way
        (4, 3, 5, (Standing.OLDER, 5)),  # newer than the one held, not than the one on its way
        (2, 7, 5, (Standing.OLDER, 7)),  # the newest of held and wanted counts
        (7, 7, 5, (Standing.SAME, 7)),
    ],
)
def test_standing(announced: int, held: int, wanted: int | None, expected: tuple[Standing, int]) -> None:
    """An announcement is wanted only if its round is newer than both the one held and the one on its way."""
    on_its_way = None if wanted is None else announcement(wanted)
    assert standing_of(announcement(announced), held, on_its_way) == expected
