"""`fedspeech demo`: where its time went, and its listening."""

from fedspeech.models.clips.datasets import load_corpus
from fedspeech_bench.demo import durations, listen_to_digits
from fedspeech_bench.word_alignment import align


def test_each_phase_lasts_from_the_end_of_the_one_before():
    ends = {"start": 12.0, "rounds": 40.5, "after": 41.0}
    assert durations(10.0, ends) == {"start": 2.0, "rounds": 28.5, "after": 0.5}
    assert list(durations(10.0, ends)) == list(ends)
    assert durations(10.0, {}) == {}


def test_the_demo_listens_to_held_out_digits_in_a_file_anyone_can_play_again(fsdd_model, tmp_path):
    wav = tmp_path / "digits.wav"
    spoken, heard = listen_to_digits(fsdd_model.onnx_path, wav)
    assert wav.stat().st_size > 0
    assert len(spoken) == 10 and set(spoken) <= set(load_corpus("fsdd").labels)
    assert align(spoken, heard).hits >= 7, (spoken, heard)
    assert listen_to_digits(fsdd_model.onnx_path, tmp_path / "again.wav") == (spoken, heard)
