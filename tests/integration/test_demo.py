"""`fedspeech demo`: its fleet, where its time went, and its listening."""

from fedspeech.models.clips.datasets import load_corpus, speakers
from fedspeech_bench.demo import DemoConfig, durations, listen_to_digits
from fedspeech_bench.fleets.fleet_files import check_fleet, fleet_path, load_fleet
from fedspeech_bench.word_alignment import align


def test_the_default_fleet_has_a_device_per_speaker_at_different_speeds_and_fits_two_cores():
    assert DemoConfig.fleet is not None
    fleet = load_fleet(DemoConfig.fleet)
    assert sorted(d.speaker for d in fleet) == sorted(speakers(load_corpus("fsdd")))
    check_fleet(fleet, cores=2)
    assert len({d.cpu_share for d in fleet}) >= 2, "the demo's devices must differ in speed"
    # none as slow as pi-mix's Pi 3s, which `--fleet pi-mix` brings: one sets the pace of every round
    assert min(d.cpu_share for d in fleet) > min(d.cpu_share for d in load_fleet(fleet_path("pi-mix")))


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
