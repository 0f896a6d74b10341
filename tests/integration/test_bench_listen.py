"""`fedspeech bench listen`: scoring by alignment, noise at an SNR, the real-noise clips, a long stream heard
in parts, and a short run."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile

from fedspeech.models.clips.datasets import bundled_data_dir, load_corpus, server_test_clips
from fedspeech.models.clips.tasks import BACKGROUND_NOISE
from fedspeech.runtime.audio_file import read_audio
from fedspeech_bench import listen_bench as listen
from fedspeech_bench.listen_bench import (
    OTHER_WORDS,
    ListenBenchConfig,
    check_config,
    hear,
    parse_models,
    run_listen_bench,
)
from fedspeech_bench.listen_streams import (
    TALK,
    WORD_RMS,
    Heard,
    Stream,
    Word,
    build_stream,
    real_noise,
    real_noise_paths,
    rms,
    speech_power,
    white_noise,
    with_noise,
)
from fedspeech_bench.word_alignment import Alignment, align
from tests.helpers.shared_data import SHARED_DATA, needs_shared

RATE = 8000


@pytest.mark.parametrize(
    ("spoken", "detected", "expected"),
    [
        ("3141", "3141", Alignment(hits=4)),
        ("3141", "3741", Alignment(hits=3, substitutions=1)),
        ("3141", "31441", Alignment(hits=4, insertions=1)),
        ("3141", "341", Alignment(hits=3, deletions=1)),
        ("3141", "", Alignment(deletions=4)),
        ("", "27", Alignment(insertions=2)),
        ("", "", Alignment()),
        ("12", "21", Alignment(hits=1, insertions=1, deletions=1)),  # as many edits as 2 substitutions
        ("123", "9", Alignment(substitutions=1, deletions=2)),
    ],
)
def test_alignment_counts_hits_substitutions_insertions_and_deletions(spoken, detected, expected):
    result = align(list(spoken), list(detected))
    assert result == expected
    assert result.words == len(spoken)


@pytest.fixture(scope="module")
def stream() -> Stream:
    """Eight held-out FSDD takes with 0.6 s of silence around each."""
    corpus = load_corpus("fsdd")
    return build_stream(server_test_clips(corpus), corpus.labels, RATE, pause_s=0.6, seed=0, words=8)


def test_the_stream_is_the_takes_with_pauses_around_them(stream):
    pause = round(0.6 * RATE)
    assert len(stream.words) == 8
    assert stream.words[0].start == pause
    assert len(stream.audio) == stream.words[-1].end + pause
    for before, after in zip(stream.words, stream.words[1:], strict=False):
        assert after.start - before.end == pause
        assert not stream.audio[before.end : after.start].any()
    assert all(stream.audio[w.start : w.end].any() for w in stream.words)
    corpus = load_corpus("fsdd")
    other = build_stream(server_test_clips(corpus), corpus.labels, RATE, pause_s=0.6, seed=1, words=8)
    assert [(w.start, w.end) for w in other.words] != [(w.start, w.end) for w in stream.words]


def test_a_stream_at_the_speakers_own_levels_keeps_each_take_as_recorded(stream):
    corpus = load_corpus("fsdd")
    clips = server_test_clips(corpus)
    own = build_stream(clips, corpus.labels, RATE, pause_s=0.6, seed=0, words=8, level=None)
    assert [(w.label, w.start, w.end) for w in own.words] == [(w.label, w.start, w.end) for w in stream.words]
    order = np.random.default_rng(0).permutation(len(clips))[:8]
    for word, i in zip(own.words, order, strict=True):
        np.testing.assert_array_equal(own.audio[word.start : word.end], read_audio(clips[i].path, RATE))
    levels = [rms(own.audio[w.start : w.end]) for w in own.words]
    assert max(levels) / min(levels) > 2, "the speakers were not recorded at one level"
    assert {round(rms(stream.audio[w.start : w.end]), 6) for w in stream.words} == {WORD_RMS}


def measured_snr_db(clean: Stream, noisy: Stream) -> float:
    """Speech power over the words against the power of what was added, over the whole stream."""
    return 10 * np.log10(
        speech_power(clean) / np.mean(np.square(noisy.audio - clean.audio, dtype=np.float64))
    )


@pytest.mark.parametrize("snr_db", [20.0, 10.0, 0.0])
def test_white_noise_is_mixed_at_the_snr_asked_for(stream, snr_db):
    noisy = with_noise(stream, white_noise(len(stream.audio), seed=0), snr_db)
    assert measured_snr_db(stream, noisy) == pytest.approx(snr_db, abs=0.1)


@needs_shared
def test_real_noise_is_mixed_at_the_snr_asked_for(stream):
    paths = real_noise_paths(SHARED_DATA, bundled_data_dir() / BACKGROUND_NOISE)
    noise = real_noise(paths[:20], RATE, len(stream.audio), seed=0)
    assert len(noise) == len(stream.audio)
    noisy = with_noise(stream, noise, 10.0)
    assert measured_snr_db(stream, noisy) == pytest.approx(10.0, abs=0.1)


def _silence_folder(root: Path, names: list[str]) -> Path:
    folder = root / "speech_commands_test" / "_silence_"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).touch()
    return root


def test_real_noise_is_the_odd_clips_and_never_a_bundled_one(tmp_path):
    names = ["a.flac", "b.flac", "c.flac", "d.flac", "e.flac"]
    data = _silence_folder(tmp_path / "data", names[::-1])
    bundled = tmp_path / "bundled"
    bundled.mkdir()
    for name in names[::2]:  # the even ones train the models
        (bundled / name).touch()
    assert [p.name for p in real_noise_paths(data, bundled)] == ["b.flac", "d.flac"]
    assert [p.name for p in real_noise_paths(data, tmp_path / "no such folder")] == ["b.flac", "d.flac"]
    (bundled / "d.flac").touch()  # a bundled clip among them is refused
    with pytest.raises(ValueError, match="d.flac"):
        real_noise_paths(data, bundled)


@needs_shared
def test_real_noise_of_the_shared_test_set_leaves_out_the_bundled_clips():
    paths = real_noise_paths(SHARED_DATA, bundled_data_dir() / BACKGROUND_NOISE)
    every = sorted(p.name for p in (SHARED_DATA / "speech_commands_test" / "_silence_").glob("*.flac"))
    assert [p.name for p in paths] == every[1::2]
    in_repository = Path(__file__).resolve().parents[2] / "data" / BACKGROUND_NOISE  # before it is installed
    assert real_noise_paths(SHARED_DATA, in_repository) == paths


def test_models_are_named_by_stem_or_given_names_and_checked(fsdd_model, tmp_path):
    model = str(fsdd_model.onnx_path)
    assert parse_models([model, f"half={model}"]) == {Path(model).stem: Path(model), "half": Path(model)}
    with pytest.raises(ValueError, match="two models named"):
        parse_models([model, model])
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_models([f"={model}"])
    with pytest.raises(ValueError, match="no model at"):
        check_config(ListenBenchConfig(models={"x": tmp_path / "missing.onnx"}))
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="junk.onnx"):
        check_config(ListenBenchConfig(models={"x": tmp_path / "junk.onnx"}))
    with pytest.raises(ValueError, match="noise-minutes"):
        check_config(ListenBenchConfig(models={"x": Path(model)}, noise_minutes=0))
    with pytest.raises(ValueError, match="talk-minutes"):
        check_config(ListenBenchConfig(models={"x": Path(model)}, talk_minutes=-1))
    check_config(ListenBenchConfig(models={"x": Path(model)}, talk_minutes=0))  # no talk


def test_a_stream_longer_than_the_listener_reads_is_heard_in_parts(fsdd_model, stream, tmp_path, monkeypatch):
    whole = hear(fsdd_model.onnx_path, stream, tmp_path / "whole.wav")
    monkeypatch.setattr(listen, "MAX_INPUT_SECONDS", len(stream.audio) / RATE / 2.5)  # in 3 parts
    parts = hear(fsdd_model.onnx_path, stream, tmp_path / "parts.wav")
    assert sorted(p.name for p in tmp_path.glob("parts*.wav")) == [f"parts-{n}.wav" for n in (1, 2, 3)]
    sizes = [len(soundfile.read(tmp_path / f"parts-{n}.wav")[0]) for n in (1, 2, 3)]
    assert sum(sizes) == len(stream.audio) and max(sizes) - min(sizes) <= 1
    # the words are heard at the times of the whole stream (to a hop of the detector's), but for those cut
    # between two parts
    assert [d.time_s for d in parts] == sorted(d.time_s for d in parts)
    cuts = [sizes[0] / RATE, (sizes[0] + sizes[1]) / RATE]
    far = [d for d in whole if min(abs(d.time_s - cut) for cut in cuts) > 1.0]
    assert far, "every word near a cut: nothing to compare"
    for d in far:
        assert any(p.label == d.label and abs(p.time_s - d.time_s) < 0.15 for p in parts), (d, parts)


def test_a_short_bench_writes_its_table_and_plots_and_hears_most_clean_words(fsdd_model, tmp_path, capsys):
    data_dir = SHARED_DATA if SHARED_DATA.is_dir() else None
    cfg = ListenBenchConfig(
        models={"trained": fsdd_model.onnx_path},
        out=tmp_path / "out",
        data_dir=data_dir,
        words=8,
        noise_minutes=0.1,
        talk_minutes=0.2,
        keep_audio=True,
        command="fedspeech bench listen --words 8",
    )
    check_config(cfg)
    results_md = run_listen_bench(cfg)
    text = results_md.read_text()
    assert (
        "| condition | words | detected in order | wrong or extra | misses | false detections/hour |" in text
    )
    assert "`fedspeech bench listen --words 8`" in text
    for png in ("detected-in-order.png", "wrong-or-extra.png", "false-per-hour.png"):
        assert (cfg.out / png).stat().st_size > 1000
    report = json.loads((cfg.out / "results.json").read_text())["models"]["trained"]
    results = {r["condition"]: r for r in report["results"]}
    kinds = ["white"] + (["real"] if data_dir else [])
    expected = (
        ["clean"]
        + [f"{k} {snr} dB" for k in kinds for snr in (20, 10)]
        + [f"own level, {k} {snr} dB" for k in kinds for snr in (20, 10, 5)]
        + ["0.3 s gaps, clean", "reverb 0.3 s", "reverb 0.6 s"]
        + [f"{k} noise alone" for k in kinds]
        + ([TALK, OTHER_WORDS] if data_dir else [])
    )
    assert list(results) == expected
    assert len(list((cfg.out / "audio").glob("*.wav"))) == len(expected)
    clean = results["clean"]
    assert clean["words"] == len(report["spoken"]) == 8
    assert clean["hits"] >= 5, clean
    assert clean["hits"] + clean["substitutions"] + clean["deletions"] == 8
    assert results["white noise alone"]["words"] == 0
    assert results["white noise alone"]["false_per_hour"] is not None
    spoken = [
        Word(w["label"], round(w["start_s"] * RATE), round(w["end_s"] * RATE)) for w in report["spoken"]
    ]
    clean_power = speech_power(
        Stream(read_audio(cfg.out / "audio" / "trained-clean.wav", RATE), RATE, spoken)
    )
    for room in ("0.3", "0.6"):
        reverb = results[f"reverb {room} s"]
        assert reverb["words"] == 8
        assert reverb["hits"] + reverb["substitutions"] + reverb["deletions"] == 8
        audio = read_audio(cfg.out / "audio" / f"trained-reverb-{room}-s.wav", RATE)
        power = speech_power(Stream(audio, RATE, spoken))
        assert abs(10 * np.log10(power / clean_power)) < 0.5
    out = capsys.readouterr().out
    if data_dir is None:
        assert "real-noise conditions skipped" in out
        assert f"{TALK} skipped" in out
    else:
        talk = results[TALK]
        assert talk["words"] == 0 and talk["minutes"] == pytest.approx(0.2)
        assert talk["false_per_hour"] == pytest.approx(talk["insertions"] * 60 / 0.2)
        assert (cfg.out / "audio" / "trained-talk-no-digits.wav").is_file()
        others = results[OTHER_WORDS]
        assert others["words"] == 0 and others["others"] == 168 and others["false_per_hour"] is None
        assert others["insertions"] == len(others["detections"]) <= 2 * 168
        assert f"of 168 other words ({100 * others['insertions'] / 168:.1f}%)" in text
        assert (cfg.out / "other-words.png").stat().st_size > 1000


def test_several_seeds_are_each_a_run_with_a_table_of_their_mean_and_spread(fsdd_model, tmp_path):
    cfg = ListenBenchConfig(
        models={"trained": fsdd_model.onnx_path}, out=tmp_path, words=4, seeds=2, noise_minutes=0.05,
        talk_minutes=0, command="fedspeech bench listen --words 4 --seeds 2",
    )  # fmt: skip
    check_config(cfg)
    text = run_listen_bench(cfg).read_text()
    report = json.loads((tmp_path / "results.json").read_text())["models"]
    assert list(report) == ["trained seed 0", "trained seed 1"]
    assert [run["seed"] for run in report.values()] == [0, 1]
    orders = [[w["label"] for w in run["spoken"]] for run in report.values()]
    assert orders[0] != orders[1]  # each seed its own word order
    hits = [{r["condition"]: r["hits"] for r in run["results"]}["clean"] for run in report.values()]
    mean = f"{np.mean([100 * h / 4 for h in hits]):.1f}% ± {np.std([100 * h / 4 for h in hits], ddof=1):.1f}"
    assert "### mean ± SD over 2 runs" in text and f"| clean | {mean} |" in text
    with pytest.raises(ValueError, match="--seeds"):
        check_config(dataclasses.replace(cfg, seeds=0))


@pytest.fixture(scope="module")
def commands_model(tmp_path_factory) -> Path:
    """An untrained model of the ten commands and `_none_`, exported as the coordinator exports one."""
    import torch

    from fedspeech.export.onnx_export import export_onnx
    from fedspeech.models.clips.tasks import spec_for
    from fedspeech_bench.coldstart_listen import listen_net, listen_task

    torch.manual_seed(0)
    task = listen_task()
    path = tmp_path_factory.mktemp("commands") / "commands.onnx"
    return export_onnx(listen_net(), spec_for(task), task.labels, path, task=task.name, threshold=0.5)


@needs_shared
def test_a_commands_model_is_heard_on_the_words_given_and_on_other_words_of_unheld_speakers(
    commands_model, tmp_path
):
    corpus = load_corpus("speech_commands", SHARED_DATA)
    commands = corpus.labels[:10]  # yes ... go: a clip's label indexes them
    clips = tuple(c for c in server_test_clips(corpus) if c.label < 10)
    heard_speakers = {
        c.speaker for c in clips[-30:]
    }  # a few: the other words are theirs alone, quick to hear
    held = frozenset(c.speaker for c in corpus.clips) - heard_speakers
    heard = Heard(
        tuple(c for c in clips if c.speaker in heard_speakers), commands, held, "talk, no command word"
    )
    with pytest.raises(ValueError, match="not FSDD's digits"):
        check_config(ListenBenchConfig(models={"commands": commands_model}))
    digits = load_corpus("fsdd")
    with pytest.raises(ValueError, match="not the words heard"):
        fsdd = Heard(tuple(server_test_clips(digits)), digits.labels)
        check_config(ListenBenchConfig(models={"commands": commands_model}, heard=fsdd))
    cfg = ListenBenchConfig(
        models={"commands": commands_model}, out=tmp_path, data_dir=SHARED_DATA, words=4,
        noise_minutes=0.05, talk_minutes=0.1, heard=heard,
    )  # fmt: skip
    check_config(cfg)
    report = json.loads(run_listen_bench(cfg).with_suffix(".json").read_text())["models"]["commands"]
    assert {w["label"] for w in report["spoken"]} <= set(commands) and len(report["spoken"]) == 4
    spoken_at = {round(w["start_s"], 3) for w in report["spoken"]}
    results = {r["condition"]: r for r in report["results"]}
    assert list(results)[-2:] == ["talk, no command word", OTHER_WORDS]
    unknown = sorted((SHARED_DATA / "speech_commands_test" / "_unknown_").glob("*.flac"))
    unheld = [p for p in unknown if p.name.split("_")[1] not in held]
    assert 0 < len(unheld) < len(unknown)
    assert results[OTHER_WORDS]["others"] == len(unheld)  # no `_unknown_` word is a command: digits are in
    assert len(spoken_at) == 4
