"""An audio file as a source of frames: read whole as mono at the model's rate, then cut into frames."""

import time
from collections.abc import Generator
from pathlib import Path

import numpy as np

MAX_INPUT_SECONDS = 600.0  # a file to listen to is read whole: ten minutes, at most ~230 MB decoded


def read_audio(path: Path, sample_rate: int) -> np.ndarray:
    """A whole audio file as float32 mono at sample_rate (channels mixed down, other rates resampled).

    AudioError (models.clips.datasets) says in one line why a file cannot be used, a file over
    MAX_INPUT_SECONDS among them.
    """
    # Decoding stays in models.clips.datasets (torch-free), not here: the coordinator and the devices'
    # training decode clips the same way.
    from fedspeech.models.clips.datasets import load_recording

    return load_recording(path, sample_rate, MAX_INPUT_SECONDS)


def file_frames(
    audio: np.ndarray,
    sample_rate: int,
    frame_size: int,
    silence_after: int = 0,
    realtime: bool = False,
    frames_per_block: int = 1,
) -> Generator[np.ndarray, None, None]:
    """Frames of audio followed by silence_after zero samples, paced at real speed if realtime.

    Paced, the frames come frames_per_block at a time, as a microphone's blocks do.
    """
    padding = silence_after + (-(len(audio) + silence_after)) % frame_size  # whole frames only
    audio = np.concatenate([audio, np.zeros(padding, dtype=np.float32)])
    block = frame_size * max(1, frames_per_block)
    start = time.monotonic()
    for i in range(0, len(audio), frame_size):
        if realtime and i % block == 0:  # a block is there once its last sample has been spoken
            time.sleep(max(0.0, start + min(i + block, len(audio)) / sample_rate - time.monotonic()))
        yield audio[i : i + frame_size]
