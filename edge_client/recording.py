"""`fedspeech record`: record a user's own takes of one label from the microphone into a data folder.

The microphone stays open for the whole session, at the task's sample rate, in 10 ms frames. Each take is
a prompt, then listening into a preallocated buffer until speech has been heard and QUIET_S of quiet
followed, or the take's window ran out. The take is then endpointed as a whole (`trim_take`): its spoken
part, with a small margin each side, is kept unless it is silent, longer than the task's clip, cut off,
clipped, or (for a word) a sound in which Silero VAD hears no voice, and then the same take is asked
again. A kept take is written as FLAC to a hidden temporary name in DATA/LABEL/, synced and renamed, so a
device daemon scanning the folder never sees half a file.

Torch-free: numpy, soundfile, sounddevice and onnxruntime (the VAD), no thread but PortAudio's callback.
"""

import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TextIO

import numpy as np
import soundfile

from fedspeech.protocol.labels import UNKNOWN_LABEL, is_word, other_speech_class
from fedspeech.protocol.messages import TaskDefinition
from fedspeech.runtime.microphone import MicrophoneError, microphone_frames
from fedspeech.runtime.voice_activity import MIN_VOICE, peak_probability

FRAME_S = 0.01
WINDOW_EXTRA_S = 2.0  # the default window is the clip plus this: time to react to the prompt
FLOOR_FRAMES = 10  # the noise floor is the quietest 100 ms (mean frame RMS) of the take
SPEECH_OVER_FLOOR = 4.0  # a speech frame is ~12 dB above the noise floor...
MIN_LEVEL = 0.003  # ...and above -50 dBFS, so digital silence or a faint hiss never counts as speech
MIN_SPEECH_FRAMES = 5  # fewer loud frames than this (50 ms) are a click, not speech
QUIET_S = 0.35  # longer than the pauses inside a word: after this much quiet the speaker has finished
MARGIN_S = 0.12  # kept each side of the loud frames, for soft onsets and tails
FULL_SCALE = 0.999  # 16-bit converters peak at 32767/32768 as float


class RecordError(Exception):
    """Something the user has to fix (a label, an option, a device, the folder); the text says what."""


class TakeRefused(Exception):
    """A take that is not kept; the text says why in a few words (silent, too long, cut off, clipped)."""


@dataclass
class RecordConfig:
    """What to record, how many takes, where to and from which microphone."""

    task: TaskDefinition
    label: str
    count: int
    data: Path  # takes go to DATA/LABEL/
    device: str | None = None  # PortAudio device name or index (default: the default input)
    take_seconds: float | None = None  # listening window per take (default: the clip plus WINDOW_EXTRA_S)

    @property
    def window_seconds(self) -> float:
        """How long one take listens at most."""
        if self.take_seconds is not None:
            return self.take_seconds
        return self.task.clip_seconds + WINDOW_EXTRA_S


def run_record(config: RecordConfig, out: TextIO | None = None, meter: TextIO | None = None) -> list[Path]:
    """Prompt for and record config.count good takes (fewer if interrupted); return the files saved."""
    out, meter = out or sys.stdout, meter or sys.stderr  # prompts and results; the level meter
    task, label = config.task, config.label
    # other words, in Speech Commands' folder for them, train a task's none class (folders.list_folder)
    other = label == UNKNOWN_LABEL and other_speech_class(task.labels) is not None
    if label not in task.labels and not other:
        labels = ", ".join(task.labels)
        hint = f", or {UNKNOWN_LABEL} (words that are no command)" if other_speech_class(task.labels) else ""
        raise RecordError(f"label {label!r} is not one of task {task.name}'s labels: {labels}{hint}")
    if config.count < 1:
        raise RecordError(f"--count must be at least 1, got {config.count}")
    window = config.window_seconds
    if not (math.isfinite(window) and window > 0):
        raise RecordError(f"--take-seconds must be a positive number of seconds, got {window}")
    folder = config.data / label
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecordError(f"cannot create {folder}: {exc.strerror or exc}") from None

    rate = task.sample_rate
    frame_size = round(rate * FRAME_S)
    buffer = np.zeros(math.ceil(window / FRAME_S) * frame_size, dtype=np.float32)
    try:
        frames = microphone_frames(config.device, rate, frame_size)
    except MicrophoneError as exc:
        raise RecordError(str(exc)) from None
    saved: list[Path] = []
    try:
        while len(saved) < config.count:
            say = "a word or two that is no command" if other else f"'{label}'"
            print(f"take {len(saved) + 1} of {config.count}: say {say}", file=out, flush=True)
            audio = listen_take(frames, buffer, frame_size, Meter(meter))
            try:
                take = trim_take(audio, rate, task.clip_seconds, voice=is_word(label) or other)
            except TakeRefused as exc:
                print(f"  refused, {exc}; once more", file=out, flush=True)
                continue
            saved.append(save_take(take, rate, folder))
            print(f"  saved {saved[-1]} ({len(take) / rate:.2f} s)", file=out, flush=True)
    except KeyboardInterrupt:
        print(f"interrupted: saved {len(saved)} of {config.count} takes in {folder}", file=out, flush=True)
        return saved
    finally:
        frames.close()  # stops the microphone
    print(f"saved {len(saved)} takes of '{label}' in {folder}", file=out, flush=True)
    return saved


def listen_take(
    frames: Iterator[np.ndarray], buffer: np.ndarray, frame_size: int, meter: "Meter"
) -> np.ndarray:
    """Record one take into buffer: until speech, then QUIET_S of quiet, or until full; the part filled."""
    levels = np.zeros(len(buffer) // frame_size)
    quiet_frames = round(QUIET_S / FRAME_S)
    floor, loud, last_loud = math.inf, 0, 0
    try:
        for i in range(len(levels)):
            frame = next(frames)
            buffer[i * frame_size : (i + 1) * frame_size] = frame
            levels[i] = level = math.sqrt(float(np.dot(frame, frame)) / frame_size)
            meter.show(i, level)
            if i + 1 < FLOOR_FRAMES:
                continue  # measuring the floor: nobody speaks in the first 100 ms after a prompt
            floor = min(floor, float(levels[i + 1 - FLOOR_FRAMES : i + 1].mean()))
            if level > speech_threshold(floor):
                loud, last_loud = loud + 1, i
            elif loud >= MIN_SPEECH_FRAMES and i - last_loud >= quiet_frames:
                return buffer[: (i + 1) * frame_size]
    finally:
        meter.done()
    return buffer


def speech_threshold(noise_floor: float) -> float:
    """The frame RMS above which a frame is speech, given the noise floor."""
    return max(MIN_LEVEL, SPEECH_OVER_FLOOR * noise_floor)


def frame_levels(audio: np.ndarray, frame_size: int) -> np.ndarray:
    """The RMS of each whole frame of audio."""
    whole = audio[: len(audio) // frame_size * frame_size].astype(np.float64).reshape(-1, frame_size)
    return np.sqrt(np.mean(np.square(whole), axis=1))


def noise_floor(levels: np.ndarray) -> float:
    """The lowest mean frame RMS over FLOOR_FRAMES consecutive frames (over all of them if fewer)."""
    if len(levels) < FLOOR_FRAMES:
        return float(levels.mean()) if len(levels) else 0.0
    return float(np.convolve(levels, np.full(FLOOR_FRAMES, 1 / FLOOR_FRAMES), "valid").min())


def trim_take(audio: np.ndarray, sample_rate: int, clip_seconds: float, voice: bool = True) -> np.ndarray:
    """The spoken part of one take plus a margin each side, at most clip_seconds; TakeRefused says why not.

    voice: the part kept must be voice to Silero VAD (a word's take), else any sound will do (noise, talk).
    """
    frame_size = round(sample_rate * FRAME_S)
    levels = frame_levels(audio, frame_size)
    loud = np.flatnonzero(levels > speech_threshold(noise_floor(levels)))
    if len(loud) < MIN_SPEECH_FRAMES:
        raise TakeRefused(f"silent: no speech heard in {len(audio) / sample_rate:.1f} s")
    start, end = loud[0] * frame_size, (loud[-1] + 1) * frame_size
    clip = round(clip_seconds * sample_rate)
    if end - start > clip:
        seconds = (end - start) / sample_rate
        raise TakeRefused(f"too long: {seconds:.2f} s of speech, the task's clips are {clip_seconds:g} s")
    if loud[-1] == len(levels) - 1:
        raise TakeRefused(f"cut off: still speaking when the {len(audio) / sample_rate:.1f} s take ended")
    margin = min(round(MARGIN_S * sample_rate), (clip - (end - start)) // 2)
    kept = audio[max(0, start - margin) : end + margin]
    if np.max(np.abs(kept)) >= FULL_SCALE:
        raise TakeRefused("clipped: it reached full scale; speak further from the microphone or turn it down")
    if voice and (heard := peak_probability(kept, sample_rate)) < MIN_VOICE:
        raise TakeRefused(f"no voice: a sound, but speech to the voice detector at most {heard:.0%}")
    return kept


def save_take(audio: np.ndarray, sample_rate: int, folder: Path) -> Path:
    """Write audio as folder/<timestamp>.flac via a hidden temporary file, synced, then renamed."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    path, temp = folder / f"{stamp}.flac", folder / f".{stamp}.flac.part"
    try:
        with open(temp, "wb") as file:
            soundfile.write(file, audio, sample_rate, format="FLAC", subtype="PCM_16")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except (OSError, soundfile.SoundFileError) as exc:
        raise RecordError(f"cannot save {path}: {exc}") from None
    finally:
        temp.unlink(missing_ok=True)  # left only by a failure or an interruption
    return path


class Meter:
    """The level while recording: a bar redrawn in place on a terminal, else a short line each second."""

    BAR = 30
    FLOOR_DB = -60.0

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.peak = 0.0

    def show(self, frame: int, level: float) -> None:
        """Take the level of frame number `frame` of the take; every so often draw the loudest since."""
        self.peak = max(self.peak, level)
        seconds = (frame + 1) * FRAME_S
        db = 20 * math.log10(max(self.peak, 1e-5))
        if self.tty and (frame + 1) % 5 == 0:
            filled = round(self.BAR * min(1.0, max(0.0, 1 - db / self.FLOOR_DB)))
            bar = "#" * filled + " " * (self.BAR - filled)
            self.stream.write(f"\r  [{bar}] {db:4.0f} dBFS {seconds:4.1f} s")
        elif not self.tty and (frame + 1) % 100 == 0:
            self.stream.write(f"  {seconds:.0f} s, level {db:.0f} dBFS\n")
        else:
            return
        self.stream.flush()
        self.peak = 0.0

    def done(self) -> None:
        """Clear the bar at the end of a take."""
        if self.tty:
            self.stream.write("\r" + " " * (self.BAR + 24) + "\r")
            self.stream.flush()
