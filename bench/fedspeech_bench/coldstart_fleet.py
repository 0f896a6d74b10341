"""The coldstart benchmark's fleet: six devices of Speech Commands speakers with a little speech each, the
speakers no device holds to score on, and one round of FedAvg with the product's own training step.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedspeech.protocol.labels import UNKNOWN_LABEL

if TYPE_CHECKING:
    from fedspeech.models.clips.datasets import Clip

WORDS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
DEVICES = 6
MAX_TAKES = 20  # of a word on a device
MISSING = 3  # words each of the last three devices lacks
MAX_TEST_CLIPS = 1500  # of the unseen speakers, drawn per seed


@dataclass(frozen=True)
class Fleet:
    """One seed's devices (waveforms, labels) and the unseen speakers' clips."""

    devices: list[tuple[np.ndarray, np.ndarray]]
    speakers: list[list[str]]
    test: tuple[np.ndarray, np.ndarray]
    unseen: list["Clip"] = field(default_factory=list)  # the clips of test, in its order
    others: list[np.ndarray] = field(default_factory=list)  # each device's speakers' `_unknown_` takes


def build_fleet(data_dir: Path, seed: int) -> Fleet:
    """Six devices of one to three speakers each, at most MAX_TAKES takes a word, the last three missing
    MISSING words, and every `_unknown_` take (other words) of their speakers; the unseen speakers' clips
    (at most MAX_TEST_CLIPS) to score on.
    """
    from fedspeech.models.clips.datasets import load_corpus, load_waveforms

    corpus = load_corpus("speech_commands", data_dir)
    words = {corpus.labels.index(w): n for n, w in enumerate(WORDS)}  # corpus label -> task label
    clips = [c for c in corpus.clips if c.label in words]
    by_speaker: dict[str, list] = {}
    for clip in clips:
        by_speaker.setdefault(clip.speaker, []).append(clip)
    rng = np.random.default_rng(seed)
    talkative = sorted(s for s, own in by_speaker.items() if len(own) >= 20)  # a device of some speech
    order = [talkative[i] for i in rng.permutation(len(talkative))]
    devices, speakers, taken = [], [], 0
    for d in range(DEVICES):
        group = order[taken : taken + 1 + d % 3]
        taken += len(group)
        missing = set(rng.choice(len(WORDS), MISSING, replace=False)) if d >= DEVICES - 3 else set()
        own = [c for s in group for c in by_speaker[s]]
        chosen = []
        for word in range(len(WORDS)):
            if word in missing:
                continue
            takes = [c for c in own if words[c.label] == word]
            chosen += [takes[i] for i in rng.permutation(len(takes))[:MAX_TAKES]]
        waveforms, labels = load_waveforms(chosen, 16000, 16000)
        devices.append((waveforms, np.array([words[int(label)] for label in labels], dtype=np.int64)))
        speakers.append(group)
    held = set(order[:taken])
    unseen = [c for c in clips if c.speaker not in held]
    unseen = [unseen[i] for i in sorted(rng.permutation(len(unseen))[:MAX_TEST_CLIPS])]
    waveforms, labels = load_waveforms(unseen, 16000, 16000)
    test = (waveforms, np.array([words[int(x)] for x in labels], dtype=np.int64))
    unknown = [c for c in corpus.clips if c.label == corpus.labels.index(UNKNOWN_LABEL)]
    others = [load_waveforms([c for c in unknown if c.speaker in g], 16000, 16000)[0] for g in speakers]
    return Fleet(devices, speakers, test, unseen, others)


def fedavg_round(
    net: Any, current: dict[str, np.ndarray], data: Sequence[tuple[np.ndarray, np.ndarray]],
    learning_rate: float, seed: int, **training: Any,
) -> dict[str, np.ndarray]:  # fmt: skip
    """One round: each device's (waveforms, labels) trained from current with the product's step and
    settings (device n with seed + n, training's extra arguments to train_local), averaged by clips.
    """
    from fedspeech.coordinator.config import RoundConfig
    from fedspeech.coordinator.strategies.aggregate import fedavg
    from fedspeech.models.train import get_arrays, set_arrays, train_local

    settings, updates, samples = RoundConfig(), [], []
    for n, (waveforms, labels) in enumerate(data):
        set_arrays(net, current)
        train_local(
            net, waveforms, labels, epochs=settings.epochs, batch_size=settings.batch_size,
            learning_rate=learning_rate, seed=seed + n, **training,
        )  # fmt: skip
        updates.append(get_arrays(net))
        samples.append(len(labels))
    return fedavg(updates, samples)
