"""The device's own data: a folder of recordings per label, or one speaker of a bundled corpus.

Scanned again before every task, so new recordings count without a restart; each file is decoded once
per version. Nothing here leaves the device but the counts per label.

A task's negatives (folders or clips inside the data folder; for a corpus speaker, inside the bundled
data) are cut into clip-length windows that train its none class, and are the noise mixed into speech.

With `--mix-synthetic N`, N takes of each word spoken by the device's own speech synthesizers join the
training side (after the device's own clips, never in its counts or its test side): a fleet of a few
takes a word learns them a little better so (`fedspeech bench coldstart`). They are spoken once per task
into the device's state folder.
"""

import functools
import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from fedspeech.models.clips.datasets import (
    AudioError,
    Clip,
    Corpus,
    bundled_data_dir,
    client_clips,
    load_corpus,
    load_waveforms,
    load_windows,
    speakers,
)
from fedspeech.models.clips.folders import ClipCache, Skipped, list_folder, list_negative, shown
from fedspeech.models.clips.synthetic import SynthesisRefused, takes_folder
from fedspeech.protocol.labels import is_word, none_class, other_speech_class
from fedspeech.protocol.messages import TaskDefinition

log = logging.getLogger(__name__)

MAX_WINDOWS_PER_FILE = 30  # clip-length windows cut from one negative file: the start of a long recording
MAX_NEGATIVE_WINDOWS = 1000  # negative windows in all, over all of a task's negatives
MAX_MIXED_TAKES = 100  # synthetic takes of a word mixed into a device's clips: more would drown its own
MAX_MIXED_BYTES = 256 * 2**20  # of synthetic takes held decoded: fewer takes a word for long clips


def _empty(num_samples: int = 0) -> np.ndarray:
    return np.zeros((0, num_samples), dtype=np.float32)


@dataclass(frozen=True)
class Split:
    """Waveforms and labels of one side of the split, with clips per label name.

    negatives holds the windows of the task's negatives (training side only): the background noise
    training mixes into speech. As many of them as the commonest label has clips are also among
    waveforms, labelled as the none class. The last `mixed` rows are synthetic takes (--mix-synthetic):
    trained on, never counted as the device's clips, never shared.
    """

    waveforms: np.ndarray
    labels: np.ndarray
    counts: dict[str, int]
    negatives: np.ndarray = field(default_factory=_empty)
    mixed: int = 0

    @property
    def clips(self) -> int:
        """The device's own rows: what it registers, reports and counts an update for."""
        return len(self.labels) - self.mixed


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

    def check(self) -> None:
        """ValueError, in words a user can act on, if the corpus or its speaker is not there.

        A folder is scanned for each task instead: recordings may come later.
        """
        if self.folder is not None or self.corpus is None or self.speaker is None:
            return
        try:
            corpus = _listed(self.corpus, self.corpus_dir)
        except FileNotFoundError as exc:
            raise ValueError(str(exc)) from None
        known = speakers(corpus)
        if self.speaker not in known:
            shown = ", ".join(known[:12]) + (f" and {len(known) - 12} more" if len(known) > 12 else "")
            raise ValueError(f"corpus {corpus.name!r} has no speaker {self.speaker!r}; its speakers: {shown}")


@functools.lru_cache(maxsize=8)
def _listed(corpus: str, corpus_dir: Path | None) -> Corpus:
    """A corpus, listed once per process however many of its speakers it hosts: it does not change."""
    return load_corpus(corpus, corpus_dir)


@dataclass(frozen=True)
class SyntheticMix:
    """Synthetic takes of each word trained on beside a device's own clips, and where they are kept.

    Each device draws its own voices' variants, rates and pitches by its seed, so a fleet hears more of
    them than one device does.
    """

    takes: int
    folder: Path
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.takes <= MAX_MIXED_TAKES:
            raise ValueError(f"synthetic takes to mix in: 1 to {MAX_MIXED_TAKES} a word, not {self.takes}")


class LocalData:
    """The device's train and test clips for a task; refresh() scans again and loads what is new."""

    def __init__(
        self, source: DataSource, max_samples: int | None = None, mix: SyntheticMix | None = None
    ) -> None:
        if (source.folder is None) == (source.corpus is None or source.speaker is None):
            raise ValueError("a data source is a folder, or a corpus and a speaker")
        self.source, self.max_samples, self.mix = source, max_samples, mix
        self._spoken: tuple[TaskDefinition, np.ndarray, np.ndarray] | None = None  # the last task's takes
        self._cache = ClipCache()
        self._negative_cache = ClipCache(functools.partial(load_windows, max_windows=MAX_WINDOWS_PER_FILE))
        self._reported: set[tuple[Path, str]] = set()
        self._missing: set[Path] = set()
        self.train = self.test = Split(_empty(), np.zeros(0, dtype=np.int64), {})

    def refresh(self, task: TaskDefinition) -> None:
        """Scan the source for the task's labels and negatives and load their clips.

        Each file skipped is logged once, in one line naming it; the negatives' windows join the training
        side, never the test. FileNotFoundError if the data folder is not there, OSError if it cannot be
        listed.
        """
        clips, skipped = self._list(task)
        kept, waveforms, bad = self._cache.load(clips, task.sample_rate, task.num_samples)
        negatives, bad_negatives = self._negative_windows(task)
        for skip in skipped + bad + bad_negatives:
            if (skip.path, skip.reason) not in self._reported:
                self._reported.add((skip.path, skip.reason))
                log.warning("skipping %s: %s", shown(skip.path), skip.reason)
        test = np.array([clip.test for clip in kept], dtype=bool)
        labels = np.array([clip.label for clip in kept], dtype=np.int64)
        none = none_class(task.labels) or 0  # a task without a none class has no negative windows
        examples = _as_many_as_a_label(negatives, labels[~test])
        train_waveforms = np.concatenate([waveforms[~test], examples])
        train_labels = np.concatenate([labels[~test], np.full(len(examples), none, dtype=np.int64)])
        train_rows = np.arange(len(train_labels))
        if self.max_samples is not None and self.max_samples < len(train_rows):
            # a fixed sample across the folder, not its first files, which would be the first labels only
            picked = np.random.default_rng(0).permutation(len(train_rows))[: self.max_samples]
            train_rows = train_rows[np.sort(picked)]
        self.train = _split(train_waveforms[train_rows], train_labels[train_rows], task, negatives)
        self.test = _split(waveforms[test], labels[test], task)
        spoken_waveforms, spoken_labels = self._synthetic(task)
        if len(spoken_labels):
            self.train = replace(
                self.train,
                waveforms=np.concatenate([self.train.waveforms, spoken_waveforms]),
                labels=np.concatenate([self.train.labels, spoken_labels]),
                mixed=len(spoken_labels),
            )

    def _synthetic(self, task: TaskDefinition) -> tuple[np.ndarray, np.ndarray]:
        """The task's synthetic takes to mix in, spoken and loaded once a task: none unless asked, or
        where they cannot be spoken (said once a task, at WARNING).
        """
        if self.mix is None:
            return _empty(task.num_samples), np.zeros(0, dtype=np.int64)
        if self._spoken is None or self._spoken[0] != task:
            words = max(1, sum(is_word(label) for label in task.labels))
            # where the task has a class for other speech, it gets as many takes as the words together
            held = 2 * words if other_speech_class(task.labels) is not None else words
            takes = max(1, min(self.mix.takes, MAX_MIXED_BYTES // (4 * task.num_samples * held)))
            try:
                folder = takes_folder(task, self.mix.folder, takes, self.mix.seed)
                clips = list_folder(folder, task.labels)[0]
                waveforms, labels = load_waveforms(clips, task.sample_rate, task.num_samples)
                log.info("training on %d synthetic takes of each word too, from %s", takes, folder)
            except (SynthesisRefused, AudioError, OSError) as exc:
                log.warning("no synthetic takes mixed in: %s", exc)
                waveforms, labels = _empty(task.num_samples), np.zeros(0, dtype=np.int64)
            self._spoken = (task, waveforms, labels)
        return self._spoken[1], self._spoken[2]

    def _negative_windows(self, task: TaskDefinition) -> tuple[np.ndarray, list[Skipped]]:
        """The windows of the task's negatives (at most MAX_NEGATIVE_WINDOWS), and the files skipped.

        A negative that is missing is logged once at INFO: a device need not have any.
        """
        if not task.negatives or none_class(task.labels) is None:
            return _empty(task.num_samples), []
        root = self.source.folder if self.source.folder is not None else bundled_data_dir()
        clips: list[Clip] = []
        skipped: list[Skipped] = []
        for negative in task.negatives:
            try:
                files, passed = list_negative(root, negative)
            except FileNotFoundError:
                if root / negative not in self._missing:
                    self._missing.add(root / negative)
                    log.info("no negatives %s: the none class trains without them", root / negative)
                continue
            except ValueError:
                skipped.append(Skipped(root / negative, "a negative must be inside the data folder"))
                continue
            clips += [Clip(path, 0, "", False) for path in files]
            skipped += passed
        # every file gives at least one window: more files than windows are never read
        _, windows, bad = self._negative_cache.read(
            clips[:MAX_NEGATIVE_WINDOWS], task.sample_rate, task.num_samples
        )
        if not windows:
            return _empty(task.num_samples), skipped + bad
        return np.concatenate(windows)[:MAX_NEGATIVE_WINDOWS], skipped + bad

    def _list(self, task: TaskDefinition) -> tuple[list[Clip], list[Skipped]]:
        source = self.source
        if source.folder is not None:
            return list_folder(source.folder, task.labels, task.negatives)
        if source.corpus is None or source.speaker is None:
            raise ValueError("a data source is a folder, or a corpus and a speaker")
        corpus = _listed(source.corpus, source.corpus_dir)
        clips, skipped = [], []
        for clip in (clip for side in client_clips(corpus, source.speaker) for clip in side):
            name = corpus.labels[clip.label]
            if name in task.labels:
                clips.append(Clip(clip.path, task.labels.index(name), clip.speaker, clip.test))
            else:
                skipped.append(Skipped(clip.path, f"{name!r} is not a label of the task"))
        return sorted(clips, key=lambda c: c.path), skipped


def _as_many_as_a_label(negatives: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """A fixed sample of the negative windows, as many as the commonest label has clips (at least one).

    The none class is one class among the others: more of it would crowd out the words. All the windows
    still serve as the noise training mixes into speech.
    """
    count = max([1, *np.bincount(labels).tolist()])
    if len(negatives) <= count:
        return negatives
    return negatives[np.sort(np.random.default_rng(0).permutation(len(negatives))[:count])]


def _split(
    waveforms: np.ndarray, labels: np.ndarray, task: TaskDefinition, negatives: np.ndarray | None = None
) -> Split:
    counts = Counter(task.labels[i] for i in labels.tolist())
    negatives = _empty(task.num_samples) if negatives is None else negatives
    return Split(
        waveforms, labels, {label: counts[label] for label in task.labels if counts[label]}, negatives
    )
