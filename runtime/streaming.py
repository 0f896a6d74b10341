"""Word detection on an endless audio stream with an exported model; numpy and onnxruntime only, never torch.

In the style of openWakeWord: audio arrives in fixed frames (`frame_ms`, 10 ms by default) at the model's
sample rate and is written into a preallocated ring buffer that holds exactly one model window
(`num_samples`, 1 s for the fedspeech models). One word, one decision:

1. Speech gate: each frame goes through a SpeechGate (an energy gate with an adaptive noise floor and a
   hangover, see speech_gate), which tells which frames belong to a segment of speech: a word, with the
   short pauses inside it. A ring holds one such flag per frame of the window.
2. Windows: every hop (`hop_ms`, 100 ms by default, counted in frames from the start of the stream) the
   newest window is classified if the hop of frames at its centre holds speech, and its probabilities are
   kept with the segment's others. A window centred in a word sees it whole, as the model saw its clips,
   but not the word before or after it when the pauses between words are at least half a window. The
   flags are read half a window late, when the gate has long settled them (pauses shorter than its
   hangover are filled in, clicks are dropped). Silence costs the gate's few sums per frame: the model is
   not run.
3. Decision: when the window's centre has left the segment, each class is scored by the mean of its
   `best_windows` highest probabilities in the segment's windows and the best class wins. It is a
   detection if it is a word (protocol.labels.is_word: `_none_`, `_silence_` and `_unknown_` never are)
   and its score reaches the threshold: the one given, else the model's calibrated one from its metadata,
   else DEFAULT_THRESHOLD. A detection's time is the stream time of the end of the speech its windows
   were centred on.
4. Words run together: in a loud, changing background the gate may not part words, and one segment then
   holds several, with noise between them. So a segment is also cut into pieces, each decided as above:
   where the winning class of its windows changes, once the piece has more than `best_windows` windows,
   and after `max_segment_s` (a window: longer than a word). In a piece, missing windows count as zeros,
   so a piece of a window or two, a flicker, rarely reaches the threshold; a piece won by the word the
   piece before it detected holds the rest of that word and does not detect it again.
5. Voice: an energy gate opens for any sound louder than the noise floor, a door or a clatter as much as
   a word, and stays open through a sentence. So Silero VAD (voice_activity) hears every frame too, and
   each classified window keeps the speech probability at its centre. A piece whose windows never reach
   `min_voice` is noise and detects nothing. A segment whose last `max_segment_s` of windows, over all its
   pieces, are voiced (`talk_voice`) over `talk_share` of them is talk, longer than any command: nothing
   in it is detected, and no window is classified until it ends. So a piece decided in a segment's first
   `max_segment_s` is held until the segment ends or has gone on that long without being talk.
   The VAD rests while the gate hears no sound (see `_hear_voice`). `voice=False` leaves the energy gate
   alone.

A model exported as two graphs (session.PairedModel) runs its log-mel front-end only on the frames a
window has that the window before did not (see windows): the same probabilities, for less.

`swap` replaces the model between two frames: the ring buffer, the gate and the frame count go on
untouched, so no audio is lost (a pair's frames are computed afresh for the next window). The windows of
the open segment are kept when the new model has the same labels (successive rounds of one task) and
dropped otherwise, so a word is decided once, by one model's view of it. A model with another sample rate
or window length is refused with a ValueError: its windows would be different audio, and whatever feeds
the detector runs at the old rate.

The detector has no threads of its own: whoever owns the audio calls `push` for every frame, and `swap`
between two calls.
"""

import math
import time
from dataclasses import dataclass, field

import numpy as np

from fedspeech.protocol import onnx_metadata as meta
from fedspeech.protocol.labels import is_word
from fedspeech.runtime.session import OnnxModel
from fedspeech.runtime.speech_gate import GateConfig, SpeechGate
from fedspeech.runtime.voice_activity import CHUNK_SECONDS, MIN_VOICE, VoiceActivity
from fedspeech.runtime.windows import window_source

CATCH_UP_S = 0.3  # audio the VAD hears first when the gate hears a sound again after a rest

DEFAULT_THRESHOLD = 0.6  # for a model without a calibrated threshold


@dataclass(frozen=True)
class Detection:
    """One detected word: its label, its score, the stream time of the end of its speech and the round of
    the model that heard it (None for a model exported outside the rounds).
    """

    label: str
    confidence: float
    time_s: float
    model_round: int | None = None


@dataclass(frozen=True)
class DetectorConfig:
    """Frame and hop sizes, the speech gate and the decision rules (see the module docstring)."""

    frame_ms: float = 10.0
    hop_ms: float = 100.0
    threshold: float | None = None  # None: the model's calibrated threshold, else DEFAULT_THRESHOLD
    best_windows: int = 3
    max_segment_s: float = 1.0
    gate: GateConfig = field(default_factory=GateConfig)
    voice: bool = True  # Silero VAD backs the gate; False: the energy gate alone
    min_voice: float = MIN_VOICE  # a piece whose windows' speech probability never reaches this is noise
    talk_voice: float = 0.3  # a window is voiced when the speech probability at its centre reaches this
    talk_share: float = 0.8  # a segment voiced over this share of max_segment_s is talk


@dataclass
class StageTimes:
    """Seconds spent per classified window in each stage: its input (the ring buffer's samples copied, or
    a pair's front-end run on the new frames and the window's frames copied), inference, post-processing.
    """

    windows: int = 0
    copy_s: float = 0.0
    inference_s: float = 0.0
    post_s: float = 0.0
    max_copy_s: float = 0.0
    max_inference_s: float = 0.0
    max_post_s: float = 0.0

    def add(self, copy_s: float, inference_s: float, post_s: float) -> None:
        """Count one classified window."""
        self.windows += 1
        self.copy_s += copy_s
        self.inference_s += inference_s
        self.post_s += post_s
        self.max_copy_s = max(self.max_copy_s, copy_s)
        self.max_inference_s = max(self.max_inference_s, inference_s)
        self.max_post_s = max(self.max_post_s, post_s)

    def summary(self) -> str:
        """One line: mean and max milliseconds per window of each stage."""
        if not self.windows:
            return "no window classified"
        n = self.windows
        return (
            f"{n} windows classified, ms per window (mean/max): "
            f"input {1e3 * self.copy_s / n:.3f}/{1e3 * self.max_copy_s:.3f}, "
            f"inference {1e3 * self.inference_s / n:.3f}/{1e3 * self.max_inference_s:.3f}, "
            f"post {1e3 * self.post_s / n:.3f}/{1e3 * self.max_post_s:.3f}"
        )


def model_threshold(model: OnnxModel) -> float | None:
    """The threshold calibrated for the model, from its metadata; None if it has none, ValueError if bad."""
    text = model.metadata.get(meta.THRESHOLD)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise ValueError(f"the model's threshold {text[:20]!r} is not a probability")
    return value


def model_round(model: OnnxModel) -> int | None:
    """The round of the global model, from its metadata; None for a model exported outside the rounds."""
    text = model.metadata.get(meta.ROUND, "")
    return int(text) if text.isdigit() else None


def segment_score(probabilities: np.ndarray, best_windows: int, whole: bool = True) -> tuple[int, float]:
    """The winning class of windows' probabilities (windows, classes) and its score, best_windows' mean.

    whole: the windows are a whole segment, else a piece of one, where missing windows count as zeros.
    """
    k = min(best_windows, len(probabilities)) if whole else best_windows
    scores = np.sort(probabilities, axis=0)[-k:].sum(axis=0) / k
    best = int(np.argmax(scores))
    return best, float(scores[best])


class StreamingDetector:
    """Fed fixed-size frames with `push`, it classifies the windows centred in speech and emits detections."""

    def __init__(self, model: OnnxModel, config: DetectorConfig | None = None, timings: bool = False):
        self.config = config or DetectorConfig()
        self.sample_rate = model.sample_rate
        self.num_samples = model.num_samples
        self.frame_size = round(self.sample_rate * self.config.frame_ms / 1000)
        hop_size = round(self.sample_rate * self.config.hop_ms / 1000)
        if not 0 < self.frame_size <= self.num_samples:
            raise ValueError(f"a frame of {self.config.frame_ms} ms does not fit the model's window")
        if hop_size < self.frame_size or hop_size % self.frame_size or hop_size > self.num_samples:
            raise ValueError(f"hop ({self.config.hop_ms} ms) must be frames, and at most a window")
        if self.config.best_windows < 1:
            raise ValueError("best_windows must be at least 1")
        for name in ("min_voice", "talk_voice", "talk_share"):
            if not 0 <= getattr(self.config, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1, not {getattr(self.config, name)}")
        given = self.config.threshold
        if given is not None and not 0 < given <= 1:
            raise ValueError(f"the threshold must be a probability in (0, 1], not {given}")
        self.hop_frames = hop_size // self.frame_size
        self.frames = 0  # frames pushed since the start of the stream
        self.timings = StageTimes() if timings else None
        self.gate = SpeechGate(self.config.gate, self.frame_size / self.sample_rate)
        self.voice = VoiceActivity(self.sample_rate) if self.config.voice else None
        self._ring = np.zeros(self.num_samples, dtype=np.float32)
        self._pos = 0  # where the next sample goes; also the oldest sample of the window
        self._hop_size = hop_size
        self._windows = window_source(model, hop_size)  # the window's samples, or a pair's log-mel frames
        window_frames = self.num_samples // self.frame_size
        self._speech = np.zeros(window_frames, dtype=bool)  # ring: is frame n % window_frames speech
        self._voice = np.zeros(window_frames, dtype=np.float32)  # ring: the speech probability after frame n
        # a frame's probability is known once the VAD's chunk that holds it is complete
        self._voice_lag = math.ceil(CHUNK_SECONDS * self.sample_rate / self.frame_size)
        self._catch_up = min(window_frames - 1, round(CATCH_UP_S * self.sample_rate / self.frame_size))
        self._voice_resting = True  # the gate has heard no sound since the VAD last heard a frame
        # the hop of frames centred on the window's centre, counted back from the newest frame
        centre = window_frames // 2 + self.hop_frames // 2
        self._centre_back = np.arange(centre - self.hop_frames + 1, centre + 1)
        self._max_windows = max(1, round(self.config.max_segment_s * 1000 / self.config.hop_ms))
        self._probabilities = np.zeros((self._max_windows, len(model.labels)), dtype=np.float32)
        self._window_voice = np.zeros(self._max_windows, dtype=np.float32)  # at each window's centre
        self._collected = 0  # windows of the open segment in _probabilities
        self._talk = False  # the open segment is talk: nothing is classified until it ends
        self._heard = 0  # windows classified in the open segment, over all its pieces
        self._voiced = np.zeros(self._max_windows, dtype=bool)  # ring: were the last ones voiced
        # decided in a segment's first max_segment_s, before it is known not to be talk
        self._pending: list[Detection] = []
        self._cut = False  # the open segment has been cut into pieces
        self._piece_word: str | None = None  # the word the piece before detected
        self._speech_end = 0  # the frame after the last speech frame seen at a window's centre
        self._model = model
        self._labels = model.labels
        self.threshold, self.threshold_origin = self._threshold_of(model)

    @property
    def model(self) -> OnnxModel:
        """The model in use."""
        return self._model

    @property
    def samples(self) -> int:
        """Samples pushed since the start of the stream."""
        return self.frames * self.frame_size

    def swap(self, model: OnnxModel) -> None:
        """Use model from the next window on; the buffered audio and the stream clock go on untouched."""
        if (model.sample_rate, model.num_samples) != (self.sample_rate, self.num_samples):
            raise ValueError(
                f"cannot swap to a model of {model.num_samples} samples at {model.sample_rate} Hz: "
                f"the stream runs windows of {self.num_samples} samples at {self.sample_rate} Hz"
            )
        threshold = self._threshold_of(model)
        if model.labels != self._labels:
            self._collected, self._cut, self._piece_word = 0, False, None
            self._probabilities = np.zeros((self._max_windows, len(model.labels)), dtype=np.float32)
        self._model = model
        self._windows = window_source(model, self._hop_size)
        self._labels = model.labels
        self.threshold, self.threshold_origin = threshold

    def push(self, frame: np.ndarray) -> Detection | None:
        """Add one frame of frame_size float samples; return a detection if it ends a word's segment."""
        if frame.shape != (self.frame_size,):
            raise ValueError(f"expected a frame of shape ({self.frame_size},), got {frame.shape}")
        end = self._pos + self.frame_size
        if end <= self.num_samples:
            self._ring[self._pos : end] = frame
        else:  # the frame wraps around the end of the ring
            split = self.num_samples - self._pos
            self._ring[self._pos :] = frame[:split]
            self._ring[: self.frame_size - split] = frame[split:]
        self._pos = end % self.num_samples
        speech = min(self.gate.push(frame), len(self._speech))
        self._speech[self.frames % len(self._speech)] = False
        if self.voice is not None:
            self._hear_voice(self.voice, frame, speech)
        self.frames += 1
        if speech:
            self._speech[np.arange(self.frames - speech, self.frames) % len(self._speech)] = True
        if self.frames % self.hop_frames:
            return None
        return self._hop()

    def _hear_voice(self, voice: VoiceActivity, frame: np.ndarray, speech: int) -> None:
        """The VAD hears the frame while the gate hears a sound, and rests while it hears none: silence and
        steady noise cost it nothing. Starting again, it first hears the ring's last CATCH_UP_S, so the
        frames before the gate opened (a word's soft start) have a probability too. Its state is not reset:
        the last it heard was the gate's hangover of quiet, and it goes on with the quiet before the sound,
        as if the rest had been cut out.
        """
        if not (speech or self.gate.is_open):
            self._voice[self.frames % len(self._voice)] = 0.0
            self._voice_resting = True
            return
        if self._voice_resting:
            back = min(self._catch_up, self.frames)
            heard = np.roll(self._ring, -self._pos)[-(back + 1) * self.frame_size : -self.frame_size]
            for k, earlier in enumerate(heard.reshape(back, self.frame_size)):
                self._voice[(self.frames - back + k) % len(self._voice)] = voice.push(earlier)
            self._voice_resting = False
        self._voice[self.frames % len(self._voice)] = voice.push(frame)

    def _hop(self) -> Detection | None:
        """Step the segment on by a hop; a detection once its segment is known not to be talk."""
        decided = self._step()
        if decided is not None:
            self._pending.append(decided)
        settled = self.voice is None or not self._heard or self._heard >= self._max_windows
        return self._pending.pop(0) if self._pending and settled else None

    def _step(self) -> Detection | None:
        """Classify the window if its centre is speech; decide a piece, or the segment once the centre has
        left it, or find it is talk.
        """
        centre = self.frames - self._centre_back  # frame numbers, the latest first
        speech = np.flatnonzero(self._speech[centre % len(self._speech)])
        if not len(speech):  # the segment is over, or there is none
            self._heard, self._talk = 0, False
            if self._collected:
                return self._decide(ended=True)
            self._cut, self._piece_word = False, None
            return None
        if self._talk:
            return None
        self._speech_end = int(centre[speech[0]]) + 1
        self._classify()
        voice = float(self._voice[(centre + self._voice_lag) % len(self._voice)].max())
        self._window_voice[self._collected - 1] = voice
        self._voiced[self._heard % self._max_windows] = voice >= self.config.talk_voice
        self._heard += 1
        if self._is_talk():
            self._talk, self._collected, self._cut, self._piece_word = True, 0, False, None
            self._pending.clear()
            return None
        n = self._collected
        if n == self._max_windows:
            return self._decide(ended=False)
        if n > self.config.best_windows + 1:
            previous, newest = self._probabilities[n - 2 : n].argmax(axis=1)
            if newest != previous:  # another class wins: the newest window starts the next piece
                return self._decide(ended=False, keep=1)
        return None

    def _classify(self) -> None:
        """Run the model on the current window and keep its probabilities with the segment's."""
        start = time.perf_counter()
        window = self._windows.window(self._ring, self.samples)
        copied = time.perf_counter()
        probabilities = self._windows.classify(window)[0]
        inferred = time.perf_counter()
        self._probabilities[self._collected] = probabilities
        self._collected += 1
        if self.timings is not None:
            self.timings.add(copied - start, inferred - copied, time.perf_counter() - inferred)

    def _decide(self, ended: bool, keep: int = 0) -> Detection | None:
        """The word of the windows collected but the newest keep, if they agree on one confidently enough.

        ended: the segment is over, else this is a piece of it and the newest keep windows start the next.
        """
        n = self._collected - keep
        whole = ended and not self._cut
        best, score = segment_score(self._probabilities[:n], self.config.best_windows, whole)
        voiced = self.voice is None or self._window_voice[:n].max() >= self.config.min_voice
        self._probabilities[:keep] = self._probabilities[n : n + keep]
        self._window_voice[:keep] = self._window_voice[n : n + keep]
        self._collected = keep
        label = self._labels[best]
        repeated = label == self._piece_word
        detected = is_word(label) and score >= self.threshold and not repeated and voiced
        self._cut = not ended
        self._piece_word = label if (detected or repeated) and not ended else None
        if not detected:
            return None
        end_s = self._speech_end * self.frame_size / self.sample_rate
        return Detection(label, score, end_s, model_round(self._model))

    def _is_talk(self) -> bool:
        """Whether the segment's last max_segment_s of windows are voiced over talk_share: talk."""
        if self.voice is None or self._heard < self._max_windows:
            return False
        return bool(self._voiced.mean() >= self.config.talk_share)

    def _threshold_of(self, model: OnnxModel) -> tuple[float, str]:
        """The threshold to use with model, and where it comes from."""
        if self.config.threshold is not None:
            return self.config.threshold, "given"
        calibrated = model_threshold(model)
        said = model.metadata.get(meta.THRESHOLD_FROM, "")[:200]  # how it was calibrated, or why not
        if calibrated is not None:
            return calibrated, said or "calibrated, from the model's metadata"
        return DEFAULT_THRESHOLD, f"the default: {said or 'the model has none calibrated'}"
