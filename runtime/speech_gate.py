"""Speech or not, frame by frame: an energy gate with an adaptive noise floor and a hangover; numpy only.

A frame's level is its RMS. The noise floor is the quietest stretch of FLOOR_BLOCK_S (the mean level of
that many frames in a row) in the last `floor_s` seconds, so it follows a fan or a street within seconds,
while the pauses between words keep it down during speech. A frame is loud when its level is above both
`min_level` and `over_floor` times the floor. A segment of speech opens after `min_speech_s` of loud
frames in a row (a click is shorter) and stays open through quiet shorter than `hangover_s`: the closure
before a stop consonant or a breath inside a word, never the pause between two words. It closes once
`hangover_s` of quiet has passed.

The frames of a segment are known as it goes: `push` returns how many of the newest frames the frame just
pushed shows to be inside a segment (the run that opened it, or the pause it bridged, and itself). Quiet
frames in a hangover are not counted until speech resumes, so the frames counted are the segment's speech,
from its first loud frame to its last, with the short pauses in between.
"""

import math
from dataclasses import dataclass

import numpy as np

FLOOR_BLOCK_S = 0.1  # the floor is a mean over this long: single quiet frames inside speech do not count


@dataclass(frozen=True)
class GateConfig:
    """When a frame is loud, and how loud frames make a segment (see the module docstring)."""

    min_level: float = 0.003  # -50 dBFS: digital silence or a faint hiss is never speech
    over_floor: float = 2.0  # 6 dB above the noise floor: steady noise never is, a voice in it is
    floor_s: float = 2.0
    hangover_s: float = 0.25  # 0.3 s joined words said 0.3 s apart into one segment, which then was talk
    min_speech_s: float = 0.05


class SpeechGate:
    """Fed one frame at a time with `push`, it tracks the noise floor and the open segment of speech."""

    def __init__(self, config: GateConfig | None = None, frame_s: float = 0.01) -> None:
        self.config = config or GateConfig()
        if not frame_s > 0:
            raise ValueError(f"a frame must last a positive time, not {frame_s} s")
        self.frames = 0  # frames pushed
        self.is_open = False  # speech heard, and less than the hangover of quiet since
        self._levels = np.zeros(max(1, round(FLOOR_BLOCK_S / frame_s)))  # ring: the last block's levels
        self._means = np.full(max(1, round(self.config.floor_s / frame_s)), np.inf)  # ring of block means
        self._hangover = max(1, round(self.config.hangover_s / frame_s))
        self._min_run = max(1, round(self.config.min_speech_s / frame_s))
        self._run = 0  # loud frames in a row
        self._quiet = 0  # quiet frames since the last loud one of the open segment

    @property
    def floor(self) -> float:
        """The noise floor: the lowest block mean level of the last floor_s (inf before the first block)."""
        return float(self._means.min())

    @property
    def threshold(self) -> float:
        """The level above which a frame is loud."""
        return max(self.config.min_level, self.config.over_floor * self.floor)

    def push(self, frame: np.ndarray) -> int:
        """Take the next frame; return how many of the newest frames, it included, it shows to be speech."""
        level = math.sqrt(float(np.dot(frame, frame)) / max(1, len(frame)))
        block = len(self._levels)
        self._levels[self.frames % block] = level
        self.frames += 1
        if self.frames >= block:
            self._means[self.frames % len(self._means)] = self._levels.mean()
        loud = level > self.threshold
        self._run = self._run + 1 if loud else 0
        if self.is_open:
            if loud:
                bridged, self._quiet = self._quiet, 0
                return bridged + 1
            self._quiet += 1
            self.is_open = self._quiet < self._hangover
            return 0
        if self._run >= self._min_run:
            self.is_open, self._quiet = True, 0
            return self._run
        return 0
