"""The listening loop: frames from any audio source through the streaming detector, new models swapped in."""

import logging
from collections.abc import Callable, Generator

import numpy as np

from fedspeech.runtime.session import OnnxModel, PairedModel
from fedspeech.runtime.streaming import Detection, StreamingDetector

log = logging.getLogger(__name__)


def listen(
    detector: StreamingDetector,
    frames: Generator[np.ndarray, None, None],
    source: str,
    *,
    newer_model: Callable[[], OnnxModel | None] | None = None,
    max_seconds: float | None = None,
    on_detection: Callable[[Detection], None] | None = None,
) -> list[Detection]:
    """Feed frames to detector until they end, max_seconds of audio or Ctrl-C; return the detections.

    Before each frame, newer_model (e.g. ModelFollower.take) may give a model to swap in; on_detection is
    called with each detection as it is made. The frames are closed at the end, which stops a microphone.
    """
    log.info(
        "listening to %s with %s%s: a window of %d samples classified every %d frames of %d in speech",
        source,
        detector.model.describe(),
        ", its front-end on new frames only" if isinstance(detector.model, PairedModel) else "",
        detector.num_samples,
        detector.hop_frames,
        detector.frame_size,
    )
    _log_threshold(detector)
    max_samples = None if max_seconds is None else max_seconds * detector.sample_rate
    detections: list[Detection] = []
    try:
        for frame in frames:
            if newer_model is not None:
                _swap_in(detector, newer_model())
            detection = detector.push(frame)
            if detection is not None:
                detections.append(detection)
                if on_detection is not None:
                    on_detection(detection)
            if max_samples is not None and detector.samples >= max_samples:
                break
    except KeyboardInterrupt:
        log.info("interrupted")
    finally:
        frames.close()
    seconds = detector.samples / detector.sample_rate
    log.info("listened to %.2f s of audio: %d detections", seconds, len(detections))
    return detections


def _swap_in(detector: StreamingDetector, model: OnnxModel | None) -> None:
    """Swap model in between two frames, if there is one; keep the current one if it does not fit."""
    if model is None:
        return
    try:
        detector.swap(model)
    except ValueError as exc:
        log.error("keeping %s: %s", detector.model.describe(), exc)
        return
    log.info("swapped in %s at %.2f s of audio", model.describe(), detector.samples / detector.sample_rate)
    _log_threshold(detector)


def _log_threshold(detector: StreamingDetector) -> None:
    """Say which threshold the detector uses and where it comes from."""
    log.info("detection threshold %.2f (%s)", detector.threshold, detector.threshold_origin)
