"""Training clips made to sound like listening: speech anywhere in the window, noise at random SNRs, and
background windows trained as the none class.

numpy only, as it runs on the devices; audiomentations would bring librosa, numba, llvmlite and scikit-learn.
"""

from dataclasses import dataclass

import numpy as np

FRAME_SECONDS = 0.01  # the frames a clip's spoken extent is measured in


@dataclass(frozen=True)
class Augmentation:
    """How training clips are changed, per batch; the defaults suit listening at 10-20 dB SNR.

    Noise and background windows are white, or else (white_share) windows of the background pool when
    there is one. A batch of n clips gets about background_share * n background windows appended.
    """

    place_speech: bool = True  # roll each clip so that its spoken part lands anywhere in the window
    speech_threshold: float = 0.1  # a frame is spoken above this fraction of the loudest frame's RMS
    noise_probability: float = 0.8  # share of clips that get noise added
    snr_db: tuple[float, float] = (5.0, 30.0)  # SNR range, measured on the clip's spoken part
    white_share: float = 0.5  # share of noise and background windows that are white
    background_share: float = 0.1  # background windows per clip in a batch, labelled as the none class
    silence_share: float = 0.1  # share of background windows that are digital silence
    white_level_db: tuple[float, float] = (-70.0, -20.0)  # RMS of white background windows, dB full scale
    background_gain_db: tuple[float, float] = (-20.0, 6.0)  # gain of the pool's background windows

    def __post_init__(self) -> None:
        shares = ("speech_threshold", "noise_probability", "white_share", "background_share", "silence_share")
        for name in shares:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, not {getattr(self, name)}")
        for name in ("snr_db", "white_level_db", "background_gain_db"):
            low, high = getattr(self, name)
            if not (np.isfinite(low) and np.isfinite(high) and low <= high):
                raise ValueError(f"{name} must be a finite range (low, high), not {getattr(self, name)}")


DEFAULT_AUGMENTATION = Augmentation()
NO_AUGMENTATION = Augmentation(place_speech=False, noise_probability=0.0, background_share=0.0)


def frame_length(sample_rate: int) -> int:
    """Samples in one 10 ms frame."""
    return max(1, round(sample_rate * FRAME_SECONDS))


def spoken_extents(waveforms: np.ndarray, frame: int, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Each clip's (starts, ends): from its first to its last frame above threshold x its loudest's RMS.

    A silent clip's extent is the whole window.
    """
    count, length = -(-waveforms.shape[1] // frame), waveforms.shape[1]
    padded = np.zeros((len(waveforms), count * frame), dtype=np.float32)
    padded[:, :length] = waveforms
    power = np.square(padded).reshape(len(waveforms), count, frame).mean(axis=2)
    loud = power >= threshold**2 * power.max(axis=1, keepdims=True)
    first, last = loud.argmax(axis=1), count - 1 - loud[:, ::-1].argmax(axis=1)
    return first * frame, np.minimum(length, (last + 1) * frame)


def place_anywhere(
    waveforms: np.ndarray, rng: np.random.Generator, frame: int, threshold: float
) -> np.ndarray:
    """Each clip rolled by a random offset, uniform over those that keep its spoken part in the window."""
    starts, ends = spoken_extents(waveforms, frame, threshold)
    shifts = rng.integers(-starts, waveforms.shape[1] - ends + 1)
    rows = [np.roll(row, shift) for row, shift in zip(waveforms, shifts, strict=True)]
    return np.stack(rows) if rows else waveforms.copy()


def mix_at_snr(clip: np.ndarray, noise: np.ndarray, snr_db: float, extent: tuple[int, int]) -> np.ndarray:
    """clip + noise scaled so that, over the spoken extent, clip power / noise power is snr_db.

    A silent clip (or silent noise) comes back unchanged: there is nothing to measure the SNR against.
    """
    start, end = extent
    speech = float(np.mean(np.square(clip[start:end], dtype=np.float64)))
    power = float(np.mean(np.square(noise[start:end], dtype=np.float64)))
    if not (speech > 0 and power > 0):
        return clip.copy()
    scale = np.sqrt(speech / (power * 10.0 ** (snr_db / 10.0)))
    return (clip + scale * noise).astype(clip.dtype)


def _pool_window(pool: np.ndarray, length: int, rng: np.random.Generator) -> np.ndarray:
    """A random window of the pool: a random row, rolled by a random offset."""
    return np.roll(pool[rng.integers(len(pool))], rng.integers(length))


def _noise(length: int, rng: np.random.Generator, white_share: float, pool: np.ndarray) -> np.ndarray:
    """Unit white noise, or a window of the pool (white_share: the chance of white when the pool has any)."""
    if len(pool) == 0 or rng.random() < white_share:
        return rng.standard_normal(length, dtype=np.float32)
    return _pool_window(pool, length, rng)


def add_noise(
    waveforms: np.ndarray,
    rng: np.random.Generator,
    augmentation: Augmentation,
    pool: np.ndarray,
    frame: int,
) -> np.ndarray:
    """Each clip, with probability noise_probability, mixed with white or pool noise at a random SNR."""
    out = waveforms.copy()
    low, high = augmentation.snr_db
    starts, ends = spoken_extents(waveforms, frame, augmentation.speech_threshold)
    for i, row in enumerate(waveforms):
        if rng.random() >= augmentation.noise_probability:
            continue
        noise = _noise(len(row), rng, augmentation.white_share, pool)
        out[i] = mix_at_snr(row, noise, rng.uniform(low, high), (starts[i], ends[i]))
    return out


def background_windows(
    count: int, length: int, rng: np.random.Generator, augmentation: Augmentation, pool: np.ndarray
) -> np.ndarray:
    """count windows of no speech: silence, white noise at random levels, or pool windows at random gains."""
    out = np.zeros((count, length), dtype=np.float32)
    for i in range(count):
        if rng.random() < augmentation.silence_share:
            continue
        if len(pool) == 0 or rng.random() < augmentation.white_share:
            level = 10.0 ** (rng.uniform(*augmentation.white_level_db) / 20.0)
            out[i] = level * rng.standard_normal(length, dtype=np.float32)
        else:
            out[i] = 10.0 ** (rng.uniform(*augmentation.background_gain_db) / 20.0) * _pool_window(
                pool, length, rng
            )
    return out


def augment_batch(
    waveforms: np.ndarray,
    labels: np.ndarray | None,
    rng: np.random.Generator,
    augmentation: Augmentation,
    sample_rate: int,
    pool: np.ndarray | None = None,
    none_class: int | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The batch to train on: clips placed and noised, then background windows labelled none_class.

    pool is an (N, num_samples) array of background noise (None or empty: white noise only). Background
    windows are added only with labels, a none class and a pool: they widen a device's own negatives.
    Without negatives, a tenth of every batch of synthetic silence and white noise held a small Speech
    Commands fleet on `_silence_` for eight rounds; that class learns from its own recordings instead.
    Deterministic per rng.
    """
    length = waveforms.shape[1]
    pool = np.zeros((0, length), dtype=np.float32) if pool is None else pool
    if pool.ndim != 2 or (len(pool) and pool.shape[1] != length):
        raise ValueError(f"the noise pool must be (N, {length}) windows, not {pool.shape}")
    frame = frame_length(sample_rate)
    out = np.asarray(waveforms, dtype=np.float32)
    if augmentation.place_speech:
        out = place_anywhere(out, rng, frame, augmentation.speech_threshold)
    out = add_noise(out, rng, augmentation, pool, frame)
    if labels is None or none_class is None or not len(pool):
        return out, labels
    count = int(rng.binomial(len(out), augmentation.background_share))
    if count == 0:
        return out, labels
    extra = background_windows(count, length, rng, augmentation, pool)
    return np.concatenate([out, extra]), np.concatenate([labels, np.full(count, none_class, labels.dtype)])
