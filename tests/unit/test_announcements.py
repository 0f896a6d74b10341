"""The newest-announcement rule the model follower and the model keeper share: rounds only move forward,
never below the floor kept across restarts."""

from dataclasses import replace

import pytest

from fedspeech.protocol.messages import BlobRef, ModelAnnouncement, ModelSpec
from fedspeech.runtime.announcements import Floor, Standing, standing_of, worth_fetching

SPEC = ModelSpec("cnn", 8000, 8000, 10)


def announcement(round: int) -> ModelAnnouncement:
    """An announcement of round's model, its files made up."""
    blob = BlobRef(f"/api/models/{round}/weights", "0" * 64, 1)
    return ModelAnnouncement(round, SPEC, [str(d) for d in range(10)], blob, blob, issued_at=1000.0 + round)


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


@pytest.mark.parametrize(
    ("announced", "held", "floor", "expected"),
    [
        (0, -1, 5, (Standing.OLDER, 5)),  # a process that just started: an old round replayed is refused
        (5, -1, 5, (Standing.NEWER, -1)),  # the round of the floor itself is wanted while it is not held
        (6, 5, 5, (Standing.NEWER, 5)),
        (5, 5, 5, (Standing.SAME, 5)),
        (4, 3, 5, (Standing.OLDER, 5)),  # newer than the one held, not than the floor
    ],
)
def test_standing_below_the_floor(
    announced: int, held: int, floor: int, expected: tuple[Standing, int]
) -> None:
    assert standing_of(announcement(announced), held, None, floor) == expected


def test_the_floor_survives_a_restart_and_only_rises(tmp_path) -> None:
    path = tmp_path / "state" / "model-floor.json"
    floor = Floor(path, "key", "root/model")
    assert floor.round == -1 and not path.exists()
    floor.raise_to(announcement(7))
    floor.raise_to(announcement(3))  # never lower
    restarted = Floor(path, "key", "root/model")
    assert (restarted.round, restarted.issued_at) == (7, 1007.0)
    assert Floor(path, "another key", "root/model").round == -1, "another coordinator's floor is not its own"
    assert Floor(path, "key", "another/model").round == -1


@pytest.mark.parametrize(
    "text", ["{not json", '{"round": "7", "issued_at": 0, "key": "key", "topic": "t"}', "[]"]
)
def test_a_damaged_floor_is_none_and_is_logged(tmp_path, caplog, text: str) -> None:
    path = tmp_path / "model-floor.json"
    path.write_text(text)
    assert Floor(path, "key", "t").round == -1
    assert "cannot read the floor" in caplog.text


def test_a_floor_that_cannot_be_written_is_kept_in_memory(tmp_path, caplog) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    floor = Floor(blocked / "model-floor.json", "key", "t")  # its folder cannot be made
    floor.raise_to(announcement(2))
    assert floor.round == 2 and "cannot keep the floor of round 2" in caplog.text


def test_worth_fetching_only_a_newer_round_with_a_model_and_raises_the_floor(tmp_path) -> None:
    floor = Floor(tmp_path / "model-floor.json", "key", "root/model")
    floor.raise_to(announcement(4))
    assert not worth_fetching(announcement(3), -1, None, floor) and floor.round == 4  # a replay
    assert not worth_fetching(announcement(4), 4, None, floor)  # held already
    assert not worth_fetching(replace(announcement(5), onnx=None), 4, None, floor) and floor.round == 5
    assert worth_fetching(announcement(6), 4, None, floor) and floor.round == 6
