"""The splits and fleets of `fedspeech bench seeds`: which clips each device trains on, which clips score it.

Each split is a corpus, a fleet and an evaluation set: a device per speaker scored on the union of
their test splits (within_setting), a fold per held-out speaker whose device is left out and whose
clips are the test set (loso_settings), and Speech Commands dealt to label-skewed Pi 4 class devices
scored on the speakers no device holds (skewed_deal, skewed_setting). The clips devices share with the
coordinator (quality's validation set, MKD's server data) are the first VALIDATION_PER_LABEL training
clips of each device and label (validation_clips). Every choice of clips and devices is made by a fixed
rule on sorted ids and paths, never tuned to a result; the data folders are folders of symbolic links
written under the bench's output folder (link_folder).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command line is built without the benchmark's heavy imports
    from fedspeech.models.clips.datasets import Clip, Corpus
    from fedspeech_bench.fleets.fleet_files import DeviceSpec

SPLITS = ("fsdd-within", "emodb-within", "emodb-loso", "speech-commands-skewed")
SPLIT_CORPUS = {
    "fsdd-within": "fsdd",
    "emodb-within": "emodb",
    "emodb-loso": "emodb",
    "speech-commands-skewed": "speech_commands",
}
VALIDATION_PER_LABEL = 2
LOSO_PREFIX = "emodb-loso-"
# the skewed deal (skewed_deal): devices, every EVERY-th speaker in sorted order kept for evaluation
SKEWED_DEVICES = 6
SKEWED_EVERY = 5
# Pi 4 class devices on good Wi-Fi, as pi4-wifi.toml: the skewed fleet differs in data, not hardware
SKEWED_CPU_SHARE, SKEWED_DELAY_MS, SKEWED_BANDWIDTH_KBPS = 0.25, 10.0, 20000.0


@dataclass(frozen=True)
class Setting:
    """One fleet to train on: its corpus, devices, coordinator extras and the clips devices share."""

    key: str  # names its runs: the split, or the split and held-out speaker
    split: str
    corpus: str
    fleet: list[DeviceSpec]
    settings: Mapping[str, Any]  # coordinator settings of the split (central evaluation), as Arm's
    validation: Path  # quality's validation_data and mkd's server_data
    personalised: bool = False  # FedBN scored by federated evaluation (within-speaker splits)
    held_out: str | None = None  # LOSO: the speaker left out


# --- data: folders of links the bench writes ------------------------------------------------------


def link_folder(folder: Path, clips: Iterable[Clip], labels: Sequence[str]) -> Path:
    """A fresh folder FOLDER/<label>/<file name> of symbolic links to the clips' files."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for clip in clips:
        link = folder / labels[clip.label] / clip.path.name
        link.parent.mkdir(exist_ok=True)
        if link.is_symlink():
            raise ValueError(f"two clips would both be {link}")
        link.symlink_to(clip.path.resolve())
    return folder


def validation_clips(
    train: Mapping[str, Sequence[Clip]], per_label: int = VALIDATION_PER_LABEL
) -> list[Clip]:
    """The first per_label clips, in path order, of each device's training clips of each label."""
    chosen: list[Clip] = []
    for device in sorted(train):
        by_label: dict[int, list[Clip]] = {}
        for clip in sorted(train[device], key=lambda c: c.path):
            by_label.setdefault(clip.label, []).append(clip)
        for label in sorted(by_label):
            chosen += by_label[label][:per_label]
    return chosen


def speaker_train_clips(corpus: Corpus, fleet: Sequence[DeviceSpec]) -> dict[str, list[Clip]]:
    """Each speaker device's training clips, by device name."""
    from fedspeech.models.clips.datasets import client_clips

    return {spec.name: client_clips(corpus, spec.speaker)[0] for spec in fleet}


def within_setting(split: str, corpus: Corpus, fleet: list[DeviceSpec], out: Path) -> Setting:
    """A device per speaker, scored on the union of their test splits (fleet_config's eval_corpus)."""
    folder = out / "data" / split / "validation"
    validation = link_folder(folder, validation_clips(speaker_train_clips(corpus, fleet)), corpus.labels)
    return Setting(split, split, corpus.name, fleet, {}, validation, personalised=True)


def loso_settings(
    corpus: Corpus, fleet: list[DeviceSpec], out: Path, folds: int | None = None
) -> list[Setting]:
    """A fold per speaker in sorted order (the first `folds`): its device out, all its clips the test set."""
    from fedspeech.models.clips.datasets import leave_one_speaker_out, speakers

    settings = []
    for speaker in speakers(corpus)[:folds]:
        key = LOSO_PREFIX + speaker
        _, held_out = leave_one_speaker_out(corpus, speaker)
        evaluation = link_folder(out / "data" / key / "eval", held_out, corpus.labels)
        others = [spec for spec in fleet if spec.speaker != speaker]
        shared = validation_clips(speaker_train_clips(corpus, others))
        validation = link_folder(out / "data" / key / "validation", shared, corpus.labels)
        central = {"eval_data": evaluation, "eval_corpus": None}
        settings.append(
            Setting(key, "emodb-loso", corpus.name, others, central, validation, held_out=speaker)
        )
    return settings


@dataclass(frozen=True)
class SkewedDeal:
    """Speech Commands dealt to label-skewed devices, and the clips of the speakers no device holds."""

    labels: tuple[str, ...]
    devices: tuple[tuple[Clip, ...], ...]  # each device's clips; its train/test split is per file
    speakers: tuple[tuple[str, ...], ...]  # each device's speakers
    lacking: tuple[tuple[str, ...], ...]  # the labels each device was dealt none of
    evaluation: tuple[Clip, ...]
    evaluation_speakers: tuple[str, ...]


def skewed_deal(corpus: Corpus, devices: int = SKEWED_DEVICES, every: int = SKEWED_EVERY) -> SkewedDeal:
    """The label-skewed fleet, by a fixed rule that never looks at a result.

    Speakers sorted by id: every `every`-th (positions every-1, 2*every-1, ...) is kept for evaluation,
    the others are dealt round-robin in that order to devices 1..`devices`, all of a speaker's clips to
    one device. The speakerless _silence_ clips, sorted by path, are dealt the same way. The second half
    of the devices each lack a block of labels, in label order: with 12 labels and 6 devices, device 4
    lacks yes, no, up, down; device 5 left, right, on, off; device 6 stop, go, _unknown_, _silence_.
    """
    from fedspeech.models.clips.datasets import SILENCE_SPEAKER

    ids = sorted({clip.speaker for clip in corpus.clips} - {SILENCE_SPEAKER})
    evaluation_speakers = ids[every - 1 :: every]
    trainers = [s for s in ids if s not in set(evaluation_speakers)]
    silence = sorted((c for c in corpus.clips if c.speaker == SILENCE_SPEAKER), key=lambda c: c.path)
    silence_eval = silence[every - 1 :: every]
    silence_train = [c for c in silence if c not in set(silence_eval)]
    skewed = devices // 2
    block = len(corpus.labels) // skewed
    lacking = [()] * (devices - skewed) + [
        tuple(corpus.labels[j * block : (j + 1) * block]) for j in range(skewed)
    ]
    dealt, names = [], []
    for i in range(devices):
        own = set(trainers[i::devices])
        missing = {corpus.labels.index(label) for label in lacking[i]}
        clips = [c for c in corpus.clips if c.speaker in own] + silence_train[i::devices]
        dealt.append(tuple(sorted((c for c in clips if c.label not in missing), key=lambda c: c.path)))
        names.append(tuple(trainers[i::devices]))
    evaluation = [c for c in corpus.clips if c.speaker in set(evaluation_speakers)] + silence_eval
    return SkewedDeal(
        corpus.labels,
        tuple(dealt),
        tuple(names),
        tuple(lacking),
        tuple(sorted(evaluation, key=lambda c: c.path)),
        tuple(evaluation_speakers),
    )


def folder_train_clips(clips: Iterable[Clip], labels: Sequence[str]) -> list[Clip]:
    """The clips a device trains on when they sit in its folder: its per-file split, models.folders."""
    from fedspeech.models.clips.folders import is_test

    return [c for c in clips if not is_test(f"{labels[c.label]}/{c.path.name}")]


def skewed_setting(corpus: Corpus, out: Path) -> tuple[Setting, SkewedDeal]:
    """The skewed fleet: a folder of links per device (`fedspeech client --data`), and its evaluation set."""
    from fedspeech_bench.fleets.fleet_files import DeviceSpec

    deal = skewed_deal(corpus)
    root = out / "data" / "speech-commands-skewed"
    fleet, train = [], {}
    for i, clips in enumerate(deal.devices):
        name = f"pi4-sc{i + 1}"
        folder = link_folder(root / "devices" / name, clips, corpus.labels)
        fleet.append(
            DeviceSpec(name, "", SKEWED_CPU_SHARE, SKEWED_DELAY_MS, SKEWED_BANDWIDTH_KBPS, data=folder)
        )
        train[name] = folder_train_clips(clips, corpus.labels)
    evaluation = link_folder(root / "eval", deal.evaluation, corpus.labels)
    validation = link_folder(root / "validation", validation_clips(train), corpus.labels)
    central = {"eval_data": evaluation, "eval_corpus": None}
    setting = Setting(
        "speech-commands-skewed", "speech-commands-skewed", corpus.name, fleet, central, validation
    )
    return setting, deal


def label_counts_table(deal: SkewedDeal) -> str:
    """Clips per label on each device of the skewed deal, and in its evaluation set."""
    from collections import Counter

    header = "| device | speakers | lacks | " + " | ".join(deal.labels) + " | total |"
    lines = [header, "|---" * (len(deal.labels) + 4) + "|"]
    rows = [
        (f"pi4-sc{i + 1}", str(len(deal.speakers[i])), ", ".join(deal.lacking[i]) or "-", deal.devices[i])
        for i in range(len(deal.devices))
    ]
    rows.append(("evaluation", str(len(deal.evaluation_speakers)), "-", deal.evaluation))
    for name, speakers, lacks, clips in rows:
        counts = Counter(deal.labels[c.label] for c in clips)
        cells = " | ".join(str(counts[label]) for label in deal.labels)
        lines.append(f"| {name} | {speakers} | {lacks} | {cells} | {len(clips)} |")
    return "\n".join(lines) + "\n"
