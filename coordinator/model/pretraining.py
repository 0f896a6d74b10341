"""A new fleet's first model, made on the coordinator before round 1 (`--init`): trained on the task's
words spoken by the machine's synthesizers (`synthetic`), and on any folder of speech the operator gives,
with the product's own training step; or read from a safetensors file.

The synthetic folder and the trained weights are cached in the state folder under a hash of everything
they depend on (the task's words, the voices, the settings, the model, the extra folder's files), so a
restart neither speaks nor trains again. Progress, with the time left, goes to the log.
"""

import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fedspeech.models.cache_key import cache_key
from fedspeech.models.clips.progress import progress_logger
from fedspeech.protocol import weights
from fedspeech.protocol.messages import ModelSpec, TaskDefinition
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)

RANDOM, SYNTHETIC = "random", "synthetic"
RANDOM_WORDS = "random weights"  # a first model made of fresh weights, in words
VERSION = 2  # of how the first model is trained: a change makes cached first models stale


@dataclass(frozen=True)
class Pretraining:
    """How the first model is trained: the synthetic takes of each word, and the training run."""

    takes: int = 300
    epochs: int = 12
    batch_size: int = 32
    learning_rate: float = 3e-3
    seed: int = 0


class InitError(ValueError):
    """A first model that cannot be made or read; the text says why, in one line."""


def init_in_words(init: str, init_data: Path | None) -> str:
    """How --init and --init-data make the first model, in words."""
    data = f"the clips in {init_data}" if init_data else None
    if init == SYNTHETIC:
        return "trained on the task's words in synthetic speech" + (f" and on {data}" if data else "")
    if init != RANDOM:
        return f"weights read from {init}"
    return f"trained on {data}" if data else RANDOM_WORDS


def start_weights(
    init: str,
    definition: TaskDefinition,
    spec: ModelSpec,
    reference: Arrays,
    state_dir: Path,
    extra_data: Path | None = None,
    settings: Pretraining = Pretraining(),
) -> Arrays | None:
    """The first model's weights for --init: None for random; a file's weights, checked against the
    reference (the task's freshly built model); or the synthetic start, made or taken from the cache.
    """
    if init == RANDOM and extra_data is None:
        return None
    if init not in (RANDOM, SYNTHETIC):
        return _read(Path(init), reference)
    return pretrained(definition, spec, state_dir, init == SYNTHETIC, extra_data, settings)


def pretrained(
    definition: TaskDefinition,
    spec: ModelSpec,
    state_dir: Path,
    synthetic: bool,
    extra_data: Path | None,
    settings: Pretraining,
) -> Arrays:
    """The task's model trained on its synthetic takes (where asked) and the extra folder's clips."""
    from fedspeech.models.clips.synthesizers import available_voices
    from fedspeech.models.clips.synthetic import SynthesisRefused, takes_folder

    folders: list[Path] = []
    key: dict[str, object] = {"spec": asdict(spec), "settings": asdict(settings), "version": VERSION}
    if synthetic:
        voices = available_voices()
        root, progress = state_dir / "synthetic", progress_logger("takes", log)
        try:
            folder = takes_folder(definition, root, settings.takes, settings.seed, voices, progress)
        except SynthesisRefused as exc:
            raise InitError(f"--init synthetic: {exc}") from None
        folders.append(folder)
        key["synthetic"] = folder.name
    if extra_data is not None:
        folders.append(extra_data)
        key["extra"] = _listing(extra_data, definition.labels)
    cached = state_dir / "pretrained" / f"{cache_key(key)}.safetensors"
    if cached.is_file():
        log.info("the first model, trained before: %s", cached)
        return weights.decode(cached.read_bytes())[0]
    arrays = _train(definition, spec, folders, settings)
    cached.parent.mkdir(parents=True, exist_ok=True)
    temporary = cached.with_suffix(".part")
    temporary.write_bytes(weights.encode(arrays, {"trained_on": ", ".join(str(f) for f in folders)}))
    temporary.replace(cached)
    return arrays


def _train(definition: TaskDefinition, spec: ModelSpec, folders: list[Path], settings: Pretraining) -> Arrays:
    """The task's model trained on the folders' clips with the bundled background noise, epoch by epoch
    down one cosine of the learning rate, its progress logged.
    """
    import torch

    from fedspeech.models import build_model
    from fedspeech.models.clips.datasets import Clip, bundled_data_dir
    from fedspeech.models.clips.folders import ClipCache, list_folder, list_negative
    from fedspeech.models.clips.tasks import BACKGROUND_NOISE
    from fedspeech.models.train import get_arrays, train_local
    from fedspeech.protocol.labels import none_class

    rate, length = definition.sample_rate, definition.num_samples
    clips = [clip for folder in folders for clip in list_folder(folder, definition.labels)[0]]
    kept, waveforms, _ = ClipCache().load(clips, rate, length)
    if not kept:
        raise InitError(f"--init: no usable clip of the task's labels in {', '.join(map(str, folders))}")
    labels = np.array([clip.label for clip in kept], dtype=np.int64)
    noise = [Clip(path, 0, "", False) for path in list_negative(bundled_data_dir(), BACKGROUND_NOISE)[0]]
    pool = ClipCache().load(noise, rate, length)[1]  # the bundled background noise, mixed into speech
    torch.manual_seed(settings.seed)
    model = build_model(spec)
    counts = np.bincount(labels, minlength=len(definition.labels)).tolist()
    log.info(
        "training the first model on %d clips (%s per label), %d epochs", len(kept), counts, settings.epochs
    )
    report, start = progress_logger("first model, epochs", log, every_s=0.0), time.monotonic()
    rng = np.random.default_rng(settings.seed)
    for epoch in range(settings.epochs):
        lr = settings.learning_rate * 0.5 * (1 + math.cos(math.pi * epoch / settings.epochs))
        chosen = balanced(labels, definition, rng)
        result = train_local(
            model, waveforms[chosen], labels[chosen], epochs=1, batch_size=settings.batch_size,
            learning_rate=lr, seed=settings.seed * 1000 + epoch, noise=pool,
            none_class=none_class(definition.labels),
        )  # fmt: skip
        report(epoch + 1, settings.epochs)
        log.debug("epoch %d: loss %.4f", epoch + 1, result.loss)
    log.info("the first model is trained in %.0f s", time.monotonic() - start)
    return get_arrays(model)


def balanced(labels: np.ndarray, definition: TaskDefinition, rng: np.random.Generator) -> np.ndarray:
    """An epoch's clips, by index: all but the other speech, and of that as many as the commonest word
    has, drawn anew each epoch.

    Synthetic other speech is as many takes as all the words together: trained whole, it outweighed each
    word ten to one, and the digits' first model took 93 % of FSDD's held-out digits for it.
    """
    from fedspeech.protocol.labels import other_speech_class, word_classes

    other = other_speech_class(definition.labels)
    if other is None:
        return np.arange(len(labels))
    counts = np.bincount(labels, minlength=len(definition.labels))
    most = max((int(counts[w]) for w in word_classes(definition.labels)), default=0)
    others = np.flatnonzero(labels == other)
    drawn = rng.choice(others, size=min(most, len(others)), replace=False)
    return np.sort(np.concatenate([np.flatnonzero(labels != other), drawn]))


def _read(path: Path, reference: Arrays) -> Arrays:
    """A safetensors file's weights, if they are the task's model's; InitError otherwise."""
    try:
        arrays = weights.decode(path.read_bytes())[0]
        weights.check_like(arrays, reference)
    except OSError as exc:
        raise InitError(f"--init {path}: cannot read it: {exc.strerror or exc}") from None
    except weights.WeightsError as exc:
        raise InitError(f"--init {path}: not weights of this task's model: {exc}") from None
    return arrays


def _listing(folder: Path, labels: list[str]) -> list[tuple[str, int, float]]:
    """What a folder's clips are, for the cache's key: each file's path, size and time."""
    from fedspeech.models.clips.folders import list_folder

    try:
        clips = list_folder(folder, labels)[0]
    except OSError as exc:
        raise InitError(f"--init-data {folder}: {exc}") from None
    return [(str(c.path.relative_to(folder)), (s := c.path.stat()).st_size, s.st_mtime) for c in clips]
