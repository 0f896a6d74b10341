"""Devices that take their task and send nothing sit out as many rounds as they let pass in a row."""

from fedspeech.coordinator.round.stragglers import MOST_SAT_OUT, Stragglers


def test_a_straggler_sits_out_as_many_rounds_as_it_let_pass_in_a_row_and_one_update_sets_it_straight():
    s = Stragglers()
    s.after(1, {"slow"}, {"a"})
    assert s.sitting_out(2, ["a", "slow"]) == {"slow"} and s.sitting_out(3, ["slow"]) == set()
    s.after(3, {"slow"}, {"a"})  # asked again in round 3, and silent again: two in a row
    assert [bool(s.sitting_out(r, ["slow"])) for r in (4, 5, 6)] == [True, True, False]
    s.after(6, set(), {"slow"})
    assert s.sitting_out(7, ["slow"]) == set() and s.in_a_row == {}


def test_no_device_sits_out_more_than_the_most():
    s = Stragglers()
    for round in range(1, 40):
        s.after(round, {"silent"}, set())
    assert s.asked_again["silent"] == 39 + 1 + MOST_SAT_OUT
