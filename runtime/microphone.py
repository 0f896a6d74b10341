"""Microphone input through PortAudio (sounddevice): fixed-size float32 mono frames from an input device.

Torch-free and light: numpy, sounddevice and soxr only, imported when a microphone is first used. The
device records at its own sample rate and the frames are resampled to the rate asked for here, in the
process, with soxr's streaming resampler, as a file's audio is. Asked for the model's 8 kHz, the sound
server converts instead (PulseAudio through ALSA's pulse plugin, with its speex resampler), and its filter
already takes 6 dB off at 3.4 kHz, 13 dB at 3.7 kHz and 20 dB at 3.9 kHz: the top of the model's band,
where the fricatives of four, six, seven and eight are. The PortAudio callback only copies each block
(and whether audio was lost before it) into a queue; the caller reads and resamples the blocks on its own
thread.
"""

import logging
import queue
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

Block = tuple[np.ndarray, bool]  # a block of samples at the device's rate, and whether input overflowed


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
    """Open an input device (name or index), mono, at its own rate; its frames at sample_rate until closed.

    PortAudio delivers frames_per_block frames' worth of audio at a time: one wake-up a block, not a frame.
    """
    sd = _sounddevice()
    index, device_rate = _input_device(sd, device, sample_rate)
    blocks: queue.Queue[Block] = queue.Queue()

    def callback(indata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        blocks.put((indata[:, 0].copy(), status.input_overflow))  # nothing else: its thread never waits

    block_size = round(frame_size * max(1, frames_per_block) * device_rate / sample_rate)
    try:
        stream = sd.InputStream(
            device=index,
            channels=1,
            samplerate=device_rate,
            blocksize=block_size,
            dtype="float32",
            callback=callback,
        )
        stream.start()  # blocks queue up until the caller reads them
    except (ValueError, sd.PortAudioError) as exc:
        raise MicrophoneError(f"cannot record from {device or index!r} at {device_rate} Hz: {exc}") from None
    if device_rate != sample_rate:
        log.info("recording at the device's %d Hz, resampled to %d Hz (soxr)", device_rate, sample_rate)
    return _recorded(stream, blocks, _resampler(device_rate, sample_rate), frame_size)


def _input_device(sd: Any, device: str | None, sample_rate: int) -> tuple[int, int]:
    """The input device's index and its own sample rate (sample_rate if PortAudio names none)."""
    spec = int(device) if device is not None and device.isdigit() else device
    try:
        info = sd.query_devices(spec, "input")
    except (ValueError, sd.PortAudioError) as exc:
        what = "no default input device" if device is None else f"no input device {device!r}"
        raise MicrophoneError(f"{what} ({exc}); see fedspeech listen --list-devices") from None
    return info["index"], round(info["default_samplerate"] or sample_rate)


def _resampler(from_rate: int, to_rate: int) -> Callable[[np.ndarray], np.ndarray]:
    """A function that resamples a stream's successive blocks from from_rate to to_rate (soxr, streaming)."""
    if from_rate == to_rate:
        return lambda block: block
    import soxr

    stream = soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32")
    return stream.resample_chunk


def _recorded(
    stream: Any,
    blocks: "queue.Queue[Block]",
    resample: Callable[[np.ndarray], np.ndarray],
    frame_size: int,
) -> Generator[np.ndarray, None, None]:
    """The stream's blocks, resampled, frame by frame; closing the iterator stops and closes the stream."""
    pending, overflows = np.zeros(0, np.float32), 0
    try:
        while True:
            block, overflowed = blocks.get()
            overflows += _count_overflow(overflowed, overflows)
            pending = np.concatenate([pending, resample(block)])
            whole = len(pending) - len(pending) % frame_size
            for start in range(0, whole, frame_size):
                yield pending[start : start + frame_size]
            pending = pending[whole:]
    finally:
        stream.close()
        if overflows:
            log.warning("%d input overflows in all: audio was lost each time", overflows)


def _count_overflow(overflowed: bool, before: int) -> int:
    """1 if a block came after an input overflow, else 0; the first one is logged at once."""
    if overflowed and not before:
        log.warning("input overflow: audio was lost before a block (read too slowly); counted until the end")
    return int(overflowed)
