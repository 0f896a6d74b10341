"""The listening benchmark's streams: held-out words at one level, pauses between them, noise at an SNR,
a reverberant room, talk that holds no task word, and other words said alone.

Words are brought to WORD_RMS each (FSDD's speakers were recorded up to 19 dB apart); the SNR is
10 log10(P_speech / P_noise), P_speech the mean power of the words' samples, pauses excluded. Real noise
is the Speech Commands test set's `_silence_` clips that training never mixes in (the odd ones in name
order), each at one level, those under QUIET_NOISE_RMS left out.

A room is a synthetic impulse response: the direct path, then Gaussian noise decaying by 60 dB in RT60
(the statistical model of late reverberation), its energy against the direct path's that of a speaker
DISTANCE_M from the device in a room of ROOM_M3. Talk is EmoDB's German sentences by 10 actors, but for
those that say a task word in German (TASK_WORD_SENTENCES): for the digits a07, "In sieben Stunden wird es
soweit sein" ("sieben" is seven); for the ten commands the sentences with the German word a command comes
from, said much as it is: a01 "Der Lappen liegt auf dem Eisschrank" ("auf", up), a02 "Das will sie am
Mittwoch abgeben" ("ab", off), b03 "An den Wochenenden bin ich jetzt immer nach Hause gefahren und habe
Agnes besucht" ("an", on), b02 "Sie haben es gerade hochgetragen und jetzt gehen sie wieder runter" and
b09 "Ich will das eben wegbringen und dann mit Karl was trinken gehen" ("gehen", go). None says an English
command itself. Other words are Speech Commands' test `_unknown_` takes (239 speakers' "bed", "bird",
"happy", "marvin", ...) but for those of the task's own words, and of the speakers the models trained on
where given, each said alone with OTHER_PAUSE_S of silence around it.
"""

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fedspeech.models.clips.datasets import Clip
from fedspeech.runtime.audio_file import read_audio

WORD_RMS = 0.05  # every word's level in the streams, -26 dBFS
QUIET_NOISE_RMS = 1e-3  # real noise clips under -60 dBFS are left out
ROOM_M3 = 50.0  # a living room
DISTANCE_M = 2.0  # from the speaker to the device
TALK_PAUSE_S = (0.2, 0.8)  # the range of the pauses between utterances of talk
# a task word -> EmoDB's sentence codes that say it in German, much as it sounds
TASK_WORD_SENTENCES = {
    "seven": ("a07",), "up": ("a01",), "off": ("a02",), "on": ("b03",), "go": ("b02", "b09"),
}  # fmt: skip
OTHER_PAUSE_S = 1.0  # of silence around each other word said alone
DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGITS = tuple("0123456789")  # FSDD's labels
TALK = "talk, no digits"  # the condition of talk for the digits


@dataclass(frozen=True)
class Heard:
    """The words a model is heard on: clips of speakers it never trained on, named by labels (a clip's label
    indexes them), the speakers it trained on (none of their other words is played), and the name of the
    condition of talk.
    """

    clips: tuple[Clip, ...]
    labels: tuple[str, ...]
    held: frozenset[str] = frozenset()
    talk: str = TALK


@dataclass(frozen=True)
class Word:
    """A spoken word in a stream: its label and samples [start, end)."""

    label: str
    start: int
    end: int


@dataclass(frozen=True)
class Stream:
    """Audio at sample_rate and the words spoken in it, in order."""

    audio: np.ndarray
    sample_rate: int
    words: list[Word]
    others: int = 0  # words said in it that are none of the task's

    @property
    def minutes(self) -> float:
        """Its length in minutes."""
        return len(self.audio) / self.sample_rate / 60


def build_stream(
    clips: Sequence[Clip],
    labels: Sequence[str],
    sample_rate: int,
    pause_s: float,
    seed: int,
    words: int | None = None,
    level: float | None = WORD_RMS,
) -> Stream:
    """The clips in a seeded shuffled order (the first `words` of them), pause_s of silence around each,
    each brought to the RMS level (None: each at the level it was recorded at).
    """
    order = np.random.default_rng(seed).permutation(len(clips))[:words]
    pause = np.zeros(round(pause_s * sample_rate), dtype=np.float32)
    parts, spoken, position = [pause], [], len(pause)
    for i in order:
        audio = read_audio(clips[i].path, sample_rate)
        audio = at_level(audio, level) if level is not None else audio
        spoken.append(Word(labels[clips[i].label], position, position + len(audio)))
        parts += [audio, pause]
        position += len(audio) + len(pause)
    return Stream(np.concatenate(parts), sample_rate, spoken)


def rms(audio: np.ndarray) -> float:
    """Root mean square of the samples."""
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))


def at_level(audio: np.ndarray, level: float) -> np.ndarray:
    """The audio scaled to this RMS."""
    return (audio * (level / rms(audio))).astype(np.float32)


def speech_power(stream: Stream) -> float:
    """The mean power of the words' samples, pauses excluded."""
    samples = np.concatenate([stream.audio[w.start : w.end] for w in stream.words])
    return float(np.mean(np.square(samples, dtype=np.float64)))


def with_noise(stream: Stream, noise: np.ndarray, snr_db: float) -> Stream:
    """The stream with the noise (as long as it) added at snr_db below the speech."""
    level = speech_power(stream) / 10 ** (snr_db / 10)
    return replace(stream, audio=stream.audio + at_level(noise, np.sqrt(level)))


def white_noise(num_samples: int, seed: int) -> np.ndarray:
    """Gaussian white noise of unit power."""
    return np.random.default_rng(seed).standard_normal(num_samples).astype(np.float32)


def real_noise_paths(data_dir: Path, bundled: Path) -> list[Path]:
    """Speech Commands' test `_silence_` clips at odd places in name order; ValueError if one is bundled."""
    folder = data_dir / "speech_commands_test" / "_silence_"
    paths = sorted(folder.glob("*.flac"), key=lambda p: p.name)
    if len(paths) < 2:
        raise FileNotFoundError(f"real noise: fewer than 2 .flac files in {folder}")
    held_out = paths[1::2]
    if bundled.is_dir():
        shared = sorted({p.name for p in held_out} & {p.name for p in bundled.iterdir()})
        if shared:
            raise ValueError(f"real noise: {len(shared)} clips ({shared[0]}, ...) are also in {bundled}")
    return held_out


def real_noise(paths: Sequence[Path], sample_rate: int, num_samples: int, seed: int) -> np.ndarray:
    """The clips at sample_rate, concatenated in a seeded shuffled order and looped to num_samples."""
    order = np.random.default_rng(seed).permutation(len(paths))
    clips = [read_audio(paths[i], sample_rate) for i in order]
    noise = np.concatenate([at_level(clip, 1.0) for clip in clips if rms(clip) >= QUIET_NOISE_RMS])
    return np.resize(noise, num_samples)


def reverberant_to_direct(rt60_s: float) -> float:
    """The energy of the room's sound against the direct sound's, DISTANCE_M from a speaker in ROOM_M3."""
    critical_m = 0.057 * np.sqrt(ROOM_M3 / rt60_s)  # Sabine's: where the two are equally loud
    return float((DISTANCE_M / critical_m) ** 2)


def room_response(rt60_s: float, sample_rate: int, seed: int) -> np.ndarray:
    """A synthetic room's impulse response: a unit direct path, then seeded Gaussian noise decaying by 60 dB
    in rt60_s, with reverberant_to_direct(rt60_s) times the direct path's energy.
    """
    t = np.arange(1, round(rt60_s * sample_rate) + 1) / sample_rate
    tail = np.random.default_rng(seed).standard_normal(len(t)) * 10 ** (-3 * t / rt60_s)
    tail *= np.sqrt(reverberant_to_direct(rt60_s) / np.sum(np.square(tail)))
    return np.concatenate([[1.0], tail]).astype(np.float32)


def reverberant(stream: Stream, rt60_s: float, seed: int) -> Stream:
    """The stream heard in a room of rt60_s (room_response), its speech power kept; the words' times are
    those of the dry stream.
    """
    from scipy.signal import fftconvolve  # here: scipy.signal takes a second to import, for every command

    wet = fftconvolve(stream.audio, room_response(rt60_s, stream.sample_rate, seed))[: len(stream.audio)]
    heard = replace(stream, audio=wet.astype(np.float32))
    return replace(heard, audio=heard.audio * np.float32(np.sqrt(speech_power(stream) / speech_power(heard))))


def word_names(labels: Sequence[str]) -> set[str]:
    """The labels as the words said: lower case, a digit as its name."""
    return {label.lower() for label in labels} | {DIGIT_NAMES[int(x)] for x in labels if x in DIGITS}


def talk_paths(data_dir: Path, labels: Sequence[str] = DIGITS) -> list[Path]:
    """EmoDB's utterances in data_dir/emodb/wav, but for the sentences that hold one of the labels' words."""
    folder = data_dir / "emodb" / "wav"
    said = word_names(labels)
    left_out = {code for word, codes in TASK_WORD_SENTENCES.items() if word in said for code in codes}
    paths = [p for p in sorted(folder.glob("*.flac")) if p.stem[2:5] not in left_out]
    if not paths:
        raise FileNotFoundError(f"talk: no EmoDB .flac files in {folder}")
    return paths


def talk(paths: Sequence[Path], sample_rate: int, num_samples: int, seed: int) -> Stream:
    """The utterances at sample_rate and WORD_RMS in a seeded shuffled order, looped, each after a pause
    drawn from TALK_PAUSE_S; num_samples long, no word of the task spoken.
    """
    rng = np.random.default_rng(seed)
    parts, length = [np.zeros(0, dtype=np.float32)], 0
    for i in itertools.cycle(rng.permutation(len(paths))):
        if length >= num_samples:
            break
        pause = np.zeros(round(rng.uniform(*TALK_PAUSE_S) * sample_rate), dtype=np.float32)
        utterance = at_level(read_audio(paths[i], sample_rate), WORD_RMS)
        parts += [pause, utterance]
        length += len(pause) + len(utterance)
    return Stream(np.concatenate(parts)[:num_samples], sample_rate, [])


def other_word_paths(data_dir: Path, labels: Sequence[str], held: Collection[str] = ()) -> list[Path]:
    """Speech Commands' test `_unknown_` takes of words that are none of the labels (a digit's name is its
    label's word), by speakers not held (`<word>_<speaker>_nohash_<n>.flac`).
    """
    folder = data_dir / "speech_commands_test" / "_unknown_"
    own = word_names(labels)
    paths = [
        p
        for p in sorted(folder.glob("*.flac"))
        if p.name.split("_")[0] not in own and p.name.split("_")[1] not in held
    ]
    if not paths:
        raise FileNotFoundError(f"other words: no .flac files of other words in {folder}")
    return paths


def words_alone(paths: Sequence[Path], sample_rate: int, seed: int) -> Stream:
    """Each take at WORD_RMS, in a seeded shuffled order, with OTHER_PAUSE_S of silence around it."""
    clips = [Clip(path, 0, "", True) for path in paths]
    said = build_stream(clips, ["other"], sample_rate, OTHER_PAUSE_S, seed)
    return Stream(said.audio, sample_rate, [], others=len(said.words))
