"""`fedspeech demo`: where its time went."""

from fedspeech_bench.demo import durations


def test_each_phase_lasts_from_the_end_of_the_one_before():
    ends = {"start": 12.0, "rounds": 40.5, "after": 41.0}
    assert durations(10.0, ends) == {"start": 2.0, "rounds": 28.5, "after": 0.5}
    assert list(durations(10.0, ends)) == list(ends)
    assert durations(10.0, {}) == {}
