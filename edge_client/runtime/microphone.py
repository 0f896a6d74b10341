"""Microphone input through PortAudio (sounddevice): fixed-size float32 mono frames from an input device.

Torch-free and light: numpy and sounddevice only, imported when a microphone is first used. The PortAudio
callback only copies each block into a queue; the caller reads the frames from it on its own thread.
"""

import queue
from collections.abc import Generator
from typing import Any

import numpy as np


class MicrophoneError(Exception):
    """No usable microphone (PortAudio missing, no such device, an unsupported rate); one line says why."""


def _sounddevice() -> Any:
    """The sounddevice module, or MicrophoneError if it or PortAudio is not installed."""
    try:
        import sounddevice
    except (ImportError, OSError) as exc:  # OSError: the PortAudio library is missing
        raise MicrophoneError(
            f"microphone input needs sounddevice and PortAudio ({exc}): "
            "pip install 'fedspeech[audio]' and apt-get install libportaudio2"
        ) from None
    return sounddevice


def list_devices() -> str:
    """PortAudio's audio devices, one per line, as sounddevice lists them."""
    return str(_sounddevice().query_devices()) or "no audio devices found"


def microphone_frames(
    device: str | None, sample_rate: int, frame_size: int, frames_per_block: int = 1
) -> Generator[np.ndarray, None, None]:
    """Open an input device (name or index) at sample_rate, mono; its frames until the iterator is closed.

    PortAudio delivers frames_per_block frames at a time: one wake-up a block instead of one a frame.
    """
    sd = _sounddevice()
    spec = int(device) if device is not None and device.isdigit() else device
    try:
        index = sd.query_devices(spec, "input")["index"]
    except (ValueError, sd.PortAudioError) as exc:
        what = "no default input device" if device is None else f"no input device {device!r}"
        raise MicrophoneError(f"{what} ({exc}); see fedspeech listen --list-devices") from None
    blocks: queue.Queue[np.ndarray] = queue.Queue()

    def callback(indata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        blocks.put(indata[:, 0].copy())  # nothing else here: PortAudio's thread must never wait

    try:
        stream = sd.InputStream(
            device=index,
            channels=1,
            samplerate=sample_rate,
            blocksize=frame_size * max(1, frames_per_block),
            dtype="float32",
            callback=callback,
        )
        stream.start()  # frames queue up until the caller reads them
    except (ValueError, sd.PortAudioError) as exc:
        raise MicrophoneError(f"cannot record from {device or index!r} at {sample_rate} Hz: {exc}") from None
    return _recorded(stream, blocks, frame_size)


def _recorded(
    stream: Any, blocks: "queue.Queue[np.ndarray]", frame_size: int
) -> Generator[np.ndarray, None, None]:
    """The stream's blocks as they come, frame by frame; closing the iterator stops and closes the stream."""
    try:
        while True:
            block = blocks.get()
            for start in range(0, len(block), frame_size):
                yield block[start : start + frame_size]
    finally:
        stream.close()
