"""A task's words spoken by the machine's speech synthesizers, as a folder of clips in the Speech Commands
convention (`OUT/<label>/*.flac`) with a SOURCE.md: what `fedspeech synthesize` writes and what a
coordinator started with `--init synthetic` trains its first model on.

Every label that is a word or phrase (not `_like_this_`) is spoken as the task file's `say` gives it, or
as its name with '_' and '-' read as spaces. The takes are spread over the synthesizers' voices first and
their espeak-ng variants, rates, pitches and intonations after, the same for every label. Each take is
resampled to the task's rate, cut to its spoken part, put in a synthetic room for a third of them (an
impulse response of decaying noise: Lehmann and Johansson's exponential model of a room's tail), and
given a level of its own. Training adds what it adds to every clip: shifts, noise, background windows.

A task with a class for speech that is no command (`_unknown_`, else `_none_`) gets as many takes of
other speech in it as all its words have together: common English words that are none of the task's and
sound like none of them (other_words), one said alone in half the takes, two or three in a row in the
rest, cut to a clip's length where longer, by the same voices and settings.
"""

import hashlib
import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import soundfile
import soxr

from fedspeech.models.cache_key import cache_key
from fedspeech.models.clips.augment import frame_length, spoken_extents
from fedspeech.models.clips.other_words import bundled_words, other_words
from fedspeech.models.clips.synthesizers import (
    ENDINGS,
    Setting,
    SynthesisError,
    Voice,
    available_voices,
    speak,
    versions,
)
from fedspeech.models.clips.tasks import default_model
from fedspeech.protocol.labels import is_word, other_speech_class, spoken
from fedspeech.protocol.messages import TaskDefinition

RATES = (0.8, 1.0, 1.25)  # of each voice's own speaking rate
PITCHES = (-1, 0, 1)
DEFAULT_TAKES = 200  # per label
MAX_TAKES = 5000
ROOM_SHARE = 1 / 3  # takes put in a synthetic room
RT60_S = (0.15, 0.7)  # the rooms' reverberation times
PEAK_DB = (-20.0, -1.0)  # each take's peak level, dB full scale
SPOKEN_THRESHOLD = 0.05  # a 10 ms frame is spoken above this fraction of the loudest frame's RMS
MARGIN_S = 0.05  # kept each side of the spoken part
OTHER_ALONE_SHARE = 0.5  # takes of other speech that say one word alone; the others say two or three
OTHER_MOST_WORDS = 3
VERSION = 2  # of how takes are made: a change makes caches of older takes stale

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (takes done, takes in all)


@dataclass(frozen=True)
class Summary:
    """What a synthesis wrote: takes per label, takes dropped and why, the voices and synthesizers."""

    out: Path
    takes: dict[str, int]
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> takes
    voices: list[str] = field(default_factory=list)
    synthesizers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """One take to make: its label, what it says, how, a key for its randomness and its file's name."""

    label: str
    text: str
    setting: Setting
    key: tuple[int, int]
    name: str


class SynthesisRefused(ValueError):
    """A task synthetic speech cannot teach, or no synthesizer to speak it; the text says which, in a line."""


def refusal(definition: TaskDefinition) -> str | None:
    """Why synthetic speech cannot teach this task, or None: emotion is how a thing is said, not what."""
    if default_model(definition) == "emotion_cnn":
        return f"task {definition.name!r} tells emotions apart: synthetic speech says words, not feelings"
    if not any(is_word(label) for label in definition.labels):
        return f"task {definition.name!r} has no word to say: its labels are all `_like_this_`"
    return None


def spoken_text(definition: TaskDefinition, label: str) -> str:
    """How a label is said: the task's `say` for it, else its name with '_' and '-' as spaces."""
    return spoken(label, definition.say)


def plan_settings(voices: Sequence[Voice], takes: int, seed: int) -> list[Setting]:
    """takes settings, spread over the voices' bases first (a synthesizer's voice, espeak-ng's language),
    then their variants, rates, pitches and intonations; the same for the same voices and seed.
    """
    rng = np.random.default_rng(seed)
    groups: dict[str, list[Setting]] = {}
    for voice in voices:
        pitches = PITCHES if voice.synthesizer == "espeak-ng" else (0,)
        for rate in RATES:
            for pitch in pitches:
                for intonation in ENDINGS:
                    groups.setdefault(voice.base, []).append(Setting(voice, rate, pitch, intonation))
    shuffled = [[group[i] for i in rng.permutation(len(group))] for _, group in sorted(groups.items())]
    interleaved = [
        group[i] for i in range(max(map(len, shuffled), default=0)) for group in shuffled if i < len(group)
    ]
    return interleaved[:takes]


def digest(definition: TaskDefinition, voices: Sequence[Voice], takes: int, seed: int) -> str:
    """A short hash of everything the takes depend on: the task's words, rate and length, the voices, the
    settings, and how takes are made.
    """
    words = {label: spoken_text(definition, label) for label in definition.labels if is_word(label)}
    other = other_label(definition)
    other_list = hashlib.sha256("\n".join(bundled_words()).encode()).hexdigest() if other else None
    key = {
        "words": words, "rate": definition.sample_rate, "seconds": definition.clip_seconds,
        "voices": [asdict(v) for v in voices], "synthesizers": versions(), "takes": takes, "seed": seed,
        "other": other, "other_words": other_list, "version": VERSION,
    }  # fmt: skip
    return cache_key(key)


def other_label(definition: TaskDefinition) -> str | None:
    """The task's class for speech that is no command, or None if it has none."""
    index = other_speech_class(definition.labels)
    return None if index is None else definition.labels[index]


def other_phrases(definition: TaskDefinition, count: int, seed: int) -> list[str]:
    """count texts of other speech for the task: a word alone, or two or three in a row."""
    commands = [spoken_text(definition, label) for label in definition.labels if is_word(label)]
    words = other_words(commands)
    rng = np.random.default_rng([seed, len(words)])
    lengths = np.where(rng.random(count) < OTHER_ALONE_SHARE, 1, rng.integers(2, OTHER_MOST_WORDS + 1, count))
    return [" ".join(rng.choice(words, n)) for n in lengths]


def make_take(
    setting: Setting,
    text: str,
    sample_rate: int,
    clip_seconds: float,
    rng: np.random.Generator,
    crop: bool = False,
) -> np.ndarray:
    """One take at the task's rate: spoken, cut to its spoken part with a margin, in a room for some,
    at a level of its own. SynthesisError if it cannot be made, or is longer than the task's clips
    (crop: a clip's length of it, at random, instead).
    """
    audio, rate = speak(setting, text)
    if rate != sample_rate:
        audio = soxr.resample(audio, rate, sample_rate).astype(np.float32)
    frame = frame_length(sample_rate)
    starts, ends = spoken_extents(audio[None], frame, SPOKEN_THRESHOLD)
    margin = round(MARGIN_S * sample_rate)
    audio = audio[max(0, int(starts[0]) - margin) : int(ends[0]) + margin]
    limit = round(clip_seconds * sample_rate)
    if len(audio) > limit and crop:
        start = int(rng.integers(len(audio) - limit + 1))
        audio = audio[start : start + limit]
    if len(audio) > limit:
        raise SynthesisError(f"longer than the task's {clip_seconds:g} s clips")
    if rng.random() < ROOM_SHARE:
        audio = np.convolve(audio, room_response(sample_rate, rng))[:limit].astype(np.float32)
    peak = float(np.abs(audio).max())
    if not peak > 0:
        raise SynthesisError("silent")
    return (audio * (10 ** (rng.uniform(*PEAK_DB) / 20) / peak)).astype(np.float32)


def room_response(sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """A synthetic room's impulse response: the direct sound, then noise decaying by 60 dB in a random
    reverberation time, a little later and quieter than it.
    """
    rt60 = rng.uniform(*RT60_S)
    length = round(rt60 * sample_rate)
    t = np.arange(length) / sample_rate
    tail = rng.normal(0.0, 1.0, length) * 10 ** (-3 * t / rt60)  # -60 dB at rt60
    delay = round(rng.uniform(0.002, 0.01) * sample_rate)
    tail[:delay] = 0.0
    tail *= rng.uniform(0.2, 0.6) / np.sqrt(np.sum(tail**2))  # the tail's energy against the direct sound
    tail[0] = 1.0
    return tail.astype(np.float32)


def synthesize(
    definition: TaskDefinition,
    out: Path,
    takes: int = DEFAULT_TAKES,
    seed: int = 0,
    voices: Sequence[Voice] | None = None,
    progress: Progress | None = None,
) -> Summary:
    """Write takes of each word label of the task into out/<label>/ and a SOURCE.md; the summary.

    SynthesisRefused for a task synthetic speech cannot teach, or when no synthesizer is found.
    Identical takes (voice variants that sound the same) are written once.
    """
    why = refusal(definition)
    if why:
        raise SynthesisRefused(why)
    if not 1 <= takes <= MAX_TAKES:
        raise SynthesisRefused(f"takes per label must be from 1 to {MAX_TAKES}, not {takes}")
    voices = available_voices() if voices is None else list(voices)
    if not voices:
        raise SynthesisRefused("no speech synthesizer found: apt-get install espeak-ng (and flite, festival)")
    settings = plan_settings(voices, takes, seed)
    labels = [label for label in definition.labels if is_word(label)]
    jobs = [
        Job(label, spoken_text(definition, label), settings[i], (n, i), settings[i].name)
        for n, label in enumerate(labels)
        for i in range(len(settings))
    ]
    other = other_label(definition)
    if other is not None:
        phrases = other_phrases(definition, len(jobs), seed)
        spread = plan_settings(voices, len(phrases), seed + 1)
        jobs += [
            Job(
                other, text, (setting := spread[i % len(spread)]), (len(labels), i), f"{i:05d}-{setting.name}"
            )
            for i, text in enumerate(phrases)
        ]
    summary = Summary(
        Path(out),
        dict.fromkeys(labels + ([other] if other else []), 0),
        {},
        sorted({job.setting.voice.name for job in jobs}),
        versions(),
    )
    dropped: Counter[str] = Counter()
    seen: set[bytes] = set()

    def one(job: Job) -> np.ndarray | str:
        """A take of a job, as 16-bit samples; why not, if it could not be made."""
        rng = np.random.default_rng([seed, *job.key])  # its room and level: the same for the same seed
        crop = job.label == other
        try:
            take = make_take(
                job.setting, job.text, definition.sample_rate, definition.clip_seconds, rng, crop
            )
        except SynthesisError as exc:
            return str(exc).split(": ")[-1]
        return np.round(take * 32767).astype(np.int16)

    for label in summary.takes:
        (Path(out) / label).mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:  # the synthesizers are processes
        for done, (job, pcm) in enumerate(zip(jobs, pool.map(one, jobs), strict=True), 1):
            if isinstance(pcm, str):
                dropped[pcm] += 1
            elif (fingerprint := hashlib.sha256(job.label.encode() + pcm.tobytes()).digest()) in seen:
                dropped["the same as another take"] += 1
            else:
                seen.add(fingerprint)
                path = Path(out) / job.label / f"{job.name}.flac"
                soundfile.write(path, pcm, definition.sample_rate, format="FLAC", subtype="PCM_16")
                summary.takes[job.label] += 1
            if progress is not None:
                progress(done, len(jobs))
    summary.dropped.update(dropped)
    (Path(out) / "SOURCE.md").write_text(source_text(definition, summary, settings, seed))
    return summary


def takes_folder(
    definition: TaskDefinition,
    root: Path,
    takes: int,
    seed: int = 0,
    voices: Sequence[Voice] | None = None,
    progress: Progress | None = None,
) -> Path:
    """The folder of the task's takes under root, named by their digest: made once, found after.

    It is written beside its final name and renamed into place, so a run stopped half way leaves no
    folder that looks complete. SynthesisRefused as synthesize says.
    """
    voices = available_voices() if voices is None else list(voices)
    folder = Path(root) / digest(definition, voices, takes, seed)
    if not folder.is_dir():
        log.info("speaking the task's words with %d voices into %s", len(voices), folder)
        partial = folder.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        synthesize(definition, partial, takes, seed, voices, progress)
        partial.rename(folder)
    return folder


def source_text(definition: TaskDefinition, summary: Summary, settings: Sequence[Setting], seed: int) -> str:
    """SOURCE.md of a synthetic folder: how it was made, from what, and what it holds."""
    words = "\n".join(
        f'- `{label}`: "{spoken_text(definition, label)}", {count} takes'
        if is_word(label)
        else f"- `{label}`: other speech, {count} takes: common English words that sound like none of the "
        "task's (the list in fedspeech's data/other_words), alone or two or three in a row"
        for label, count in summary.takes.items()
    )
    tools = "\n".join(f"- {name}: {version}" for name, version in summary.synthesizers.items())
    bases = sorted({s.voice.base for s in settings})
    dropped = (
        "\n".join(f"- {reason}: {count}" for reason, count in sorted(summary.dropped.items())) or "- none"
    )
    return f"""# Synthetic speech for task `{definition.name}`

- Made by `fedspeech synthesize` from the task's words; no person's voice is in it.
- Words, as spoken:
{words}
- Synthesizers:
{tools}
- Voices: {len(summary.voices)} ({len(bases)} voices, espeak-ng's with its variants): {", ".join(bases)}.
- Settings: speaking rate x {", ".join(f"{r:g}" for r in RATES)} of each voice's own; pitch low, own and high
  (espeak-ng only); intonation of a statement, an exclamation and a question; seed {seed}. The file name
  of each take says its synthesizer, voice, rate, pitch and intonation.
- Each take: resampled to {definition.sample_rate} Hz, cut to its spoken part with {MARGIN_S * 1000:g} ms
  each side, in a synthetic room (decaying noise, reverberation time {RT60_S[0]:g} to {RT60_S[1]:g} s) for
  about {ROOM_SHARE:.0%} of them, peak level {PEAK_DB[0]:g} to {PEAK_DB[1]:g} dB full scale, 16-bit FLAC.
- Dropped:
{dropped}
- Licence: the audio is what the synthesizers said of the task's own words and of common words; their
  licences cover the programs and voices, not what they say.
"""
