"""The device's own data: a folder of recordings per label, or one speaker of a bundled corpus.

Scanned again before every task, so new recordings count without a restart; each file is decoded once
per version. Nothing here leaves the device but the counts per label.
"""

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedspeech.models.datasets import Clip, Corpus, client_clips, load_corpus
from fedspeech.models.folders import ClipCache, Skipped, list_folder
from fedspeech.protocol.messages import TaskDefinition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Split:
    """Waveforms and labels of one side of the split, with clips per label name."""

    waveforms: np.ndarray
    labels: np.ndarray
    counts: dict[str, int]


@dataclass(frozen=True)
class DataSource:
    """Where a device's clips come from: a folder DIR/<label>/*, or a corpus speaker (emulated fleets)."""

    folder: Path | None = None
    corpus: str | None = None
    speaker: str | None = None
    corpus_dir: Path | None = None  # where the corpus lives (None: the bundled data)

    def describe(self) -> str:
        """Where the clips come from, for logs."""
        return str(self.folder) if self.folder is not None else f"{self.corpus} speaker {self.speaker}"


class LocalData:
    """The device's train and test clips for a task; refresh() scans again and loads what is new."""

    def __init__(self, source: DataSource, max_samples: int | None = None) -> None:
        if (source.folder is None) == (source.corpus is None or source.speaker is None):
            raise ValueError("a data source is a folder, or a corpus and a speaker")
        self.source, self.max_samples = source, max_samples
        self._cache = ClipCache()
        self._reported: set[tuple[Path, str]] = set()
        self._corpus: Corpus | None = None
        self.train = self.test = Split(np.zeros((0, 0), dtype=np.float32), np.zeros(0, dtype=np.int64), {})

    def refresh(self, task: TaskDefinition) -> None:
        """Scan the source for the task's labels and load its clips; each file skipped is logged once."""
        clips, skipped = self._list(task)
        kept, waveforms, bad = self._cache.load(clips, task.sample_rate, task.num_samples)
        for skip in skipped + bad:
            if (skip.path, skip.reason) not in self._reported:
                self._reported.add((skip.path, skip.reason))
                log.warning("skipping %s: %s", skip.path, skip.reason)
        test = np.array([clip.test for clip in kept], dtype=bool)
        labels = np.array([clip.label for clip in kept], dtype=np.int64)
        train_rows = np.flatnonzero(~test)
        if self.max_samples is not None and self.max_samples < len(train_rows):
            # a fixed sample across the folder, not its first files, which would be the first labels only
            picked = np.random.default_rng(0).permutation(len(train_rows))[: self.max_samples]
            train_rows = train_rows[np.sort(picked)]
        self.train = _split(waveforms[train_rows], labels[train_rows], task)
        self.test = _split(waveforms[test], labels[test], task)

    def _list(self, task: TaskDefinition) -> tuple[list[Clip], list[Skipped]]:
        source = self.source
        if source.folder is not None:
            return list_folder(source.folder, task.labels)
        if source.corpus is None or source.speaker is None:
            raise ValueError("a data source is a folder, or a corpus and a speaker")
        if self._corpus is None:  # a bundled corpus does not change: listed once
            self._corpus = load_corpus(source.corpus, source.corpus_dir)
        corpus = self._corpus
        clips, skipped = [], []
        for clip in (clip for side in client_clips(corpus, source.speaker) for clip in side):
            name = corpus.labels[clip.label]
            if name in task.labels:
                clips.append(Clip(clip.path, task.labels.index(name), clip.speaker, clip.test))
            else:
                skipped.append(Skipped(clip.path, f"{name!r} is not a label of the task"))
        return sorted(clips, key=lambda c: c.path), skipped


def _split(waveforms: np.ndarray, labels: np.ndarray, task: TaskDefinition) -> Split:
    counts = Counter(task.labels[i] for i in labels.tolist())
    return Split(waveforms, labels, {label: counts[label] for label in task.labels if counts[label]})
