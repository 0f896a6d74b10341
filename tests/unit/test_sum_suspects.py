"""Finding the device behind a secure sum that was too long, from sums alone."""

from fedspeech.coordinator.privacy.sum_suspects import SumSuspects

FLEET = ["a", "b", "c", "d", "e"]


def rounds_until_named(liar: str, suspects: SumSuspects, first: int = 1) -> tuple[str | None, int]:
    """Rounds from `first`, each sum too long while the liar is in it; who is named, and in which round."""
    for round in range(first, first + 20):
        summed = [d for d in FLEET if d not in suspects.aside(round, FLEET)]
        if liar in summed:
            suspects.refused(summed)
        else:
            named = suspects.passed(round)
            if named is not None or not suspects.until:
                return named, round
    return None, -1


def test_the_liar_is_found_by_leaving_one_out_in_turn_and_sits_out_twice_as_long_each_time():
    suspects = SumSuspects()
    assert rounds_until_named("d", suspects) == ("d", 5), "refused with all, then without a, b, c"
    assert suspects.until == {"d": 7}
    assert suspects.aside(7, FLEET) == {"d"} and suspects.aside(8, FLEET) == set()
    assert rounds_until_named("d", suspects, first=8) == ("d", 12), "all in round 8, then a, b, c out"
    assert suspects.until == {"d": 16}, "named twice: sits out four rounds"


def test_a_sum_that_passes_without_any_suspect_names_no_one():
    suspects = SumSuspects()
    assert suspects.aside(1, FLEET) == set() and suspects.passed(1) is None
    assert suspects.until == {} and suspects.suspects == []
