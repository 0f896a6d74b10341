"""The listening benchmark's streams: held-out words at one level, pauses between them, and noise at an SNR.

Words are brought to WORD_RMS each (FSDD's speakers were recorded up to 19 dB apart); the SNR is
10 log10(P_speech / P_noise), P_speech the mean power of the words' samples, pauses excluded. Real noise
is the Speech Commands test set's `_silence_` clips that training never mixes in (the odd ones in name
order), each at one level, those under QUIET_NOISE_RMS left out.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fedspeech.edge_client.runtime.audio_file import read_audio
from fedspeech.models.clips.datasets import Clip

WORD_RMS = 0.05  # every word's level in the streams, -26 dBFS
QUIET_NOISE_RMS = 1e-3  # real noise clips under -60 dBFS are left out


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
