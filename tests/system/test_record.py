"""`fedspeech record`: checking takes of real speech, and recording them through a virtual microphone."""

import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr

from fedspeech.edge_client.recording import TakeRefused, trim_take
from tests.helpers.waiting import wait_for

RECORDINGS = Path(__file__).resolve().parents[2] / "data" / "fsdd" / "recordings"
RATE = 8000  # FSDD's
TASK = 'name = "digits16k"\nlabels = ["three", "seven"]\nsample_rate = 16000\nclip_seconds = 1.0\n'
TASK_RATE, CLIP_S = 16000, 1.0
TAKES = [f"3_jackson_{take}" for take in (10, 11, 12, 13, 14)]  # FSDD clips hold the spoken part only

# PulseAudio servers of their own: one at a time on a machine, so with test_listen.py's on one worker
pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("pulseaudio")]


def clip(name: str) -> np.ndarray:
    """An FSDD recording, float32 at 8 kHz."""
    audio, rate = soundfile.read(RECORDINGS / f"{name}.flac", dtype="float32")
    assert rate == RATE
    return audio


def padded(audio: np.ndarray, before: float = 0.7, after: float = 0.7) -> np.ndarray:
    """audio with that many seconds of silence before and after."""
    return np.concatenate(
        [np.zeros(int(before * RATE), np.float32), audio, np.zeros(int(after * RATE), np.float32)]
    )


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))


def knock(seconds: float = 0.25) -> np.ndarray:
    """A knock or a clatter: white noise, loud at once and dying away (0.05 s to fall by e)."""
    time = np.arange(round(seconds * RATE)) / RATE
    rng = np.random.default_rng(1)
    return (0.3 * np.exp(-time / 0.05) * rng.standard_normal(len(time))).astype(np.float32)


def similarity(audio: np.ndarray, reference: np.ndarray) -> float:
    """The peak normalized cross-correlation: 1 when audio holds reference exactly (and silence around it)."""
    peak = np.max(np.abs(np.correlate(audio, reference, "full")))
    return float(peak / (np.linalg.norm(audio) * np.linalg.norm(reference)))


# ---- one take, endpointed and checked ----


@pytest.mark.parametrize("noise", [0.0, 0.003])
def test_spoken_part_is_kept_with_a_margin(noise):
    rng = np.random.default_rng(0)
    for name in TAKES:
        speech = clip(name)
        take = padded(speech) + (noise * rng.standard_normal(len(speech) + int(1.4 * RATE))).astype(
            np.float32
        )
        kept = trim_take(take, RATE, CLIP_S)
        # the word whole, the silence around it trimmed to a margin of about 0.1 s a side
        assert len(speech) / RATE <= len(kept) / RATE <= min(CLIP_S, len(speech) / RATE + 0.3), name
        assert similarity(kept, speech) > 0.95, name


@pytest.mark.parametrize(
    "case",
    ["zeros", "room noise", "too long", "cut off", "clipped", "knock"],
)
def test_bad_takes_are_refused_with_the_reason(case):
    rng = np.random.default_rng(0)
    three = clip("3_jackson_10")
    take = {
        "zeros": np.zeros(3 * RATE, np.float32),
        "room noise": (0.01 * rng.standard_normal(3 * RATE)).astype(np.float32),
        "too long": padded(np.concatenate([clip(name) for name in TAKES[:3]])),  # three words in one take
        "cut off": padded(three, after=0.0),
        "clipped": padded(np.clip(20 * three, -1.0, 1.0)),
        "knock": padded(knock()),  # loud and short, a word to the energy but no voice
    }[case]
    reason = {"zeros": "silent", "room noise": "silent", "too long": "too long", "knock": "no voice"}.get(
        case, case
    )
    with pytest.raises(TakeRefused, match=f"^{reason}: "):
        trim_take(take, RATE, CLIP_S)


def test_a_take_of_no_word_keeps_any_sound():
    """voice=False, for labels that are no word (_none_): the knock a word's take refuses is kept."""
    sound = knock()
    kept = trim_take(padded(sound), RATE, CLIP_S, voice=False)
    assert len(sound) / RATE <= len(kept) / RATE <= len(sound) / RATE + 0.3
    assert similarity(kept, sound) > 0.95


# ---- the command ----


def record(*args: str) -> subprocess.CompletedProcess:
    """Run `python -m fedspeech record ARGS` to the end."""
    command = [sys.executable, "-m", "fedspeech", "record", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--label", "four"],
            "label 'four' is not one of task fsdd's labels: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, _none_, "
            "or _unknown_ (words that are no command)",
        ),
        (["--label", "4", "--count", "0"], "--count must be at least 1, got 0"),
    ],
)
def test_bad_options_are_one_clear_line(tmp_path, args, expected):
    result = record("--task", "fsdd", "--data", str(tmp_path / "data"), *args)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == f"fedspeech record: {expected}"
    assert not (tmp_path / "data").exists()


# ---- through a virtual microphone ----


def wait_in_log(proc: subprocess.Popen, predicate, timeout: float, what: str) -> None:
    """Poll until predicate(log text) holds; fail with the log if it does not in time."""
    try:
        wait_for(lambda: predicate(proc.log_path.read_text()), timeout, what)
    except pytest.fail.Exception:
        pytest.fail(f"timed out after {timeout} s waiting for {what}; the log:\n{proc.log_path.read_text()}")


def play(microphone_env: dict, path: Path) -> None:
    """Play a file into the virtual microphone, to its end."""
    subprocess.run(
        ["paplay", "--device=fedspeech_mic", str(path)], env=microphone_env, check=True, timeout=30
    )


def flac_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.flac")) if folder.is_dir() else []


def test_records_takes_through_pulseaudio(virtual_microphone, processes, tmp_path):
    task, data = tmp_path / "task.toml", tmp_path / "data"
    task.write_text(TASK)
    folder = data / "three"
    wavs = []
    for name in TAKES:
        wavs.append(tmp_path / f"{name}.wav")
        soundfile.write(wavs[-1], padded(clip(name), 0.6, 0.8), RATE)
    args = ["--task", str(task), "--label", "three", "--count", "5", "--data", str(data), "--device", "pulse"]
    proc = processes.start("record", "record", *args)
    prompt = "take {} of 5: say 'three'"

    # nothing said during the first take: refused as silent, and asked again
    wait_in_log(proc, lambda text: prompt.format(1) in text, 30, "the first prompt")
    wait_in_log(
        proc, lambda text: "refused, silent: no speech heard in 3.0 s" in text, 15, "a silent refusal"
    )
    wait_in_log(proc, lambda text: text.count(prompt.format(1)) == 2, 5, "the first take asked again")
    assert flac_files(folder) == []

    for i, wav in enumerate(wavs):
        wait_in_log(proc, lambda text, i=i: prompt.format(i + 1) in text, 10, f"the prompt for take {i + 1}")
        play(virtual_microphone, wav)
        wait_in_log(proc, lambda _, i=i: len(flac_files(folder)) == i + 1, 10, f"take {i + 1} saved")
    assert proc.wait(timeout=15) == 0
    log = proc.log_path.read_text()
    assert f"saved 5 takes of 'three' in {folder}" in log
    assert re.search(r"^  \d s, level -\d+ dBFS$", log, re.MULTILINE), "no level meter lines"

    files = flac_files(folder)
    assert sorted(path.name for path in folder.iterdir()) == [path.name for path in files]  # no temp files
    assert len(files) == 5
    for path, name, wav in zip(files, TAKES, wavs, strict=True):
        speech = clip(name)
        audio, rate = soundfile.read(path, dtype="float32")
        assert rate == TASK_RATE
        seconds = len(audio) / rate
        assert seconds <= CLIP_S, (path, seconds)
        assert abs(seconds - len(speech) / RATE) <= 0.3, (path, seconds, len(speech) / RATE)
        assert seconds < soundfile.info(wav).duration - 1.0  # the padding's silence was trimmed
        assert rms(audio) > 0.5 * rms(speech) > 0.01  # the word, at the level it was played
        assert similarity(soxr.resample(audio, TASK_RATE, RATE), speech) > 0.9, path


def test_sigterm_keeps_the_takes_saved(virtual_microphone, processes, tmp_path):
    data = tmp_path / "data"
    wav = tmp_path / "three.wav"
    soundfile.write(wav, padded(clip(TAKES[0]), 0.6, 0.8), RATE)
    args = ["--task", "fsdd", "--label", "3", "--count", "3", "--data", str(data), "--device", "pulse"]
    proc = processes.start("record", "record", *args)
    wait_in_log(proc, lambda text: "take 1 of 3: say '3'" in text, 30, "the first prompt")
    play(virtual_microphone, wav)
    wait_in_log(proc, lambda text: "take 2 of 3: say '3'" in text, 10, "the first take saved")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert f"interrupted: saved 1 of 3 takes in {data / '3'}" in proc.log_path.read_text()
    assert [path.suffix for path in (data / "3").iterdir()] == [".flac"]
    audio, rate = soundfile.read(flac_files(data / "3")[0], dtype="float32")
    assert rate == RATE and similarity(audio, clip(TAKES[0])) > 0.9
