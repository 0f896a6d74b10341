"""The speech synthesizers this machine has, their English voices, and one take of a text by one of them.

Each synthesizer is optional and found at run time: espeak-ng (its English voices, each with every voice
variant it ships), flite (its built-in voices) and festival (the voices installed with it). A take varies
the voice, the speaking rate, the pitch (espeak-ng only: the others have no simple pitch setting) and the
clause's intonation, by the punctuation that ends it. Texts reach the synthesizers on standard input or in
a file, never as arguments, so no text is ever read as an option.
"""

import io
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

TIMEOUT_S = 30.0  # one take, by the slowest synthesizer
ENDINGS = {"statement": ".", "exclamation": "!", "question": "?"}  # the intonations, by punctuation
FLITE_VOICES = ("kal", "kal16", "awb", "rms", "slt")  # flite's general voices (awb_time says only times)


@dataclass(frozen=True)
class Voice:
    """A voice of a synthesizer: espeak-ng's are "<language>+<variant>"."""

    synthesizer: str  # espeak-ng, flite or festival
    name: str

    @property
    def base(self) -> str:
        """The voice without its espeak-ng variant: takes are spread over these first."""
        return f"{self.synthesizer}:{self.name.split('+')[0]}"


@dataclass(frozen=True)
class Setting:
    """How one take is spoken."""

    voice: Voice
    rate: float  # a multiple of the voice's own speaking rate
    pitch: int  # -1 low, 0 the voice's own, 1 high (espeak-ng only)
    intonation: str  # a key of ENDINGS

    @property
    def name(self) -> str:
        """A file name for the take: synthesizer, voice and settings."""
        voice = self.voice.name.replace("+", "-")
        return f"{self.voice.synthesizer}-{voice}-r{self.rate:g}-p{self.pitch:+d}-{self.intonation}"


class SynthesisError(RuntimeError):
    """A synthesizer that failed on a take, or gave no audio."""


def espeak_voices() -> list[Voice]:
    """espeak-ng's English voices that speak on their own (not those that need MBROLA), each with every
    voice variant; none without espeak-ng.
    """
    if shutil.which("espeak-ng") is None:
        return []
    languages = [
        row[1]
        for row in _table(["espeak-ng", "--voices=en"])
        if len(row) >= 5 and row[1].startswith("en") and not row[4].startswith("mb/")
    ]
    variants = [row[4].split("/", 1)[1] for row in _table(["espeak-ng", "--voices=variant"]) if len(row) >= 5]
    return [
        Voice("espeak-ng", f"{lang}+{variant}") for lang in dict.fromkeys(languages) for variant in variants
    ]


def flite_voices() -> list[Voice]:
    """flite's general voices this build has; none without flite."""
    if shutil.which("flite") is None:
        return []
    listed = _run(["flite", "-lv"]).decode(errors="replace").split(":", 1)[-1].split()
    return [Voice("flite", name) for name in FLITE_VOICES if name in listed]


def festival_voices() -> list[Voice]:
    """The voices installed with festival; none without it."""
    if shutil.which("festival") is None or shutil.which("text2wave") is None:
        return []
    printed = _run(["festival", "-b", "(begin (print (voice.list)))"]).decode(errors="replace")
    names = printed.strip().strip("()").split()
    return [Voice("festival", name) for name in names if name.replace("_", "").isalnum()]


def available_voices() -> list[Voice]:
    """Every voice of every synthesizer found here."""
    return espeak_voices() + flite_voices() + festival_voices()


def versions() -> dict[str, str]:
    """Each synthesizer found, with the version it reports."""
    asks = {"espeak-ng": ["--version"], "flite": ["--version"], "festival": ["--version"]}
    found = {}
    for name, ask in asks.items():
        if shutil.which(name) is None:
            continue
        try:  # flite says its version and exits 1
            done = subprocess.run([name, *ask], capture_output=True, timeout=TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = [line.strip() for line in (done.stdout + done.stderr).decode(errors="replace").splitlines()]
        first = next((line for line in lines if line and not line.startswith("Carnegie")), name)
        found[name] = first.split("  Data at")[0][:120]
    return found


def speak(setting: Setting, text: str) -> tuple[np.ndarray, int]:
    """One take of text: float32 mono audio and its sample rate. SynthesisError if there is none."""
    spoken = f"{text}{ENDINGS[setting.intonation]}"
    voice = setting.voice
    if voice.synthesizer == "espeak-ng":
        pitch = 50 + 25 * setting.pitch  # espeak-ng's pitch runs 0 to 99, 50 its default
        wpm = round(175 * setting.rate)  # words a minute, 175 its default
        command = ["espeak-ng", "-v", voice.name, "-s", str(wpm), "-p", str(pitch), "--stdin", "--stdout"]
        return _audio(_run(command, spoken.encode()), setting)
    with tempfile.TemporaryDirectory(prefix="fedspeech-say-") as folder:
        wav, script = Path(folder) / "take.wav", Path(folder) / "text.txt"
        script.write_text(spoken)
        stretch = f"{1 / setting.rate:.3f}"  # longer durations speak slower
        if voice.synthesizer == "flite":
            _run(["flite", "-voice", voice.name, "-f", str(script), "-o", str(wav), "--setf",
                  f"duration_stretch={stretch}"])  # fmt: skip
        elif voice.synthesizer == "festival":
            _run(["text2wave", "-eval", f"(voice_{voice.name})", "-eval",
                  f"(Parameter.set 'Duration_Stretch {stretch})", "-o", str(wav), str(script)])  # fmt: skip
        else:
            raise SynthesisError(f"no synthesizer {voice.synthesizer!r}")
        if not wav.is_file():
            raise SynthesisError(f"{setting.name}: the synthesizer wrote no audio")
        return _audio(wav.read_bytes(), setting)


def _audio(data: bytes, setting: Setting) -> tuple[np.ndarray, int]:
    """A synthesizer's WAV bytes as float32 mono; SynthesisError if they hold no sound."""
    try:
        audio, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (RuntimeError, TypeError) as exc:
        raise SynthesisError(f"{setting.name}: unreadable audio ({exc})") from None
    mono = audio.mean(axis=1)
    if not len(mono) or not np.isfinite(mono).all() or np.abs(mono).max() < 1e-3:
        raise SynthesisError(f"{setting.name}: silent")
    return mono, int(rate)


def _run(command: list[str], stdin: bytes = b"") -> bytes:
    """A synthesizer's standard output; SynthesisError if it fails or takes too long."""
    try:
        done = subprocess.run(command, input=stdin, capture_output=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SynthesisError(f"{command[0]}: {exc}") from None
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise SynthesisError(f"{command[0]}: {reason[0][:200]}")
    return done.stdout


def _table(command: list[str]) -> list[list[str]]:
    """The rows of a table espeak-ng prints, its header left out."""
    return [line.split() for line in _run(command).decode(errors="replace").splitlines()[1:]]
