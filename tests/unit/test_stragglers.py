"""Devices that take their task and send nothing are asked less, the more rounds in a row they let pass."""

from fedspeech.coordinator.round.stragglers import MOST_SAT_OUT, Stragglers


def test_a_straggler_sits_out_one_round_fewer_than_it_let_pass_in_a_row_and_one_update_sets_it_straight():
    s = Stragglers()
    s.after(1, {"slow"}, {"a"})  # once may be the network's fault
    assert s.sitting_out(2, ["a", "slow"]) == set()
    s.after(2, {"slow"}, {"a"})
    assert [bool(s.sitting_out(r, ["slow"])) for r in (3, 4)] == [True, False]
    s.after(4, {"slow"}, set())  # three in a row: it sits out two
    assert [bool(s.sitting_out(r, ["slow"])) for r in (5, 6, 7)] == [True, True, False]
    s.after(7, set(), {"slow"})
    assert s.sitting_out(8, ["slow"]) == set() and s.in_a_row == {}


def test_no_device_sits_out_more_than_the_most():
    s = Stragglers()
    for round in range(1, 40):
        s.after(round, {"silent"}, set())
    assert s.asked_again["silent"] == 39 + 1 + MOST_SAT_OUT
