"""`fedspeech eval MODEL DIR`: an exported model's accuracy on a folder of labelled clips, DIR/<label>/*,
and its confusion matrix. No torch: the ONNX model runs as a listener runs it.
"""

import argparse
import logging
from pathlib import Path

import numpy as np

log = logging.getLogger("fedspeech.eval")

BATCH = 64  # clips scored at once


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `fedspeech eval` to the command line."""
    e = sub.add_parser(
        "eval", help="a model's accuracy and confusion matrix on a folder of clips DIR/<label>/* (no torch)"
    )
    e.add_argument("model", type=Path, metavar="MODEL", help="an exported ONNX model (a round's, the demo's)")
    e.add_argument(
        "folder", type=Path, metavar="DIR", help="clips in DIR/<label>/, named by the model's labels"
    )
    e.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Score the model on every usable clip of the folder; print the accuracy and the confusion matrix."""
    from fedspeech.models.clips.datasets import AudioError, load_audio
    from fedspeech.models.clips.folders import list_folder, shown
    from fedspeech.runtime.session import ModelError, load_model

    try:
        model = load_model(args.model)
    except ModelError as exc:
        raise SystemExit(f"fedspeech eval: {exc}") from None
    labels = model.labels
    try:
        clips, skipped = list_folder(args.folder, labels)
    except FileNotFoundError:
        raise SystemExit(f"fedspeech eval: {args.folder}: no such folder") from None
    except OSError as exc:
        raise SystemExit(f"fedspeech eval: cannot list {args.folder}: {exc.strerror}") from None
    for skip in skipped:
        log.warning("skipping %s: %s", shown(skip.path), skip.reason)
    truth, scores = [], []
    for start in range(0, len(clips), BATCH):
        batch, batch_truth = [], []
        for clip in clips[start : start + BATCH]:
            try:
                batch.append(load_audio(clip.path, model.sample_rate, model.num_samples))
            except AudioError as exc:
                log.warning("skipping %s", exc)
                continue
            batch_truth.append(clip.label)
        if batch:
            scores.append(model.predict(np.stack(batch)))
            truth += batch_truth
    if not truth:
        raise SystemExit(
            f"fedspeech eval: no usable clips in {args.folder}/<label>/ for the model's labels "
            f"({', '.join(labels)}): put each label's recordings in a folder of its name"
        )
    predicted = np.concatenate(scores).argmax(axis=1)
    print(report(np.array(truth), predicted, labels, args.folder))


def report(truth: np.ndarray, predicted: np.ndarray, labels: list[str], folder: Path) -> str:
    """The accuracy, per-label recall and the confusion matrix (rows: the clip's label; columns: heard)."""
    confusion = np.zeros((len(labels), len(labels)), dtype=np.int64)
    np.add.at(confusion, (truth, predicted), 1)
    correct = int(np.trace(confusion))
    lines = [f"{len(truth)} clips in {folder}: accuracy {correct / len(truth):.4f} ({correct} right)"]
    width = max(6, *(len(label) for label in labels))
    lines.append(" " * width + "  heard: " + " ".join(f"{label:>{width}}" for label in labels) + "  recall")
    for i, label in enumerate(labels):
        held = int(confusion[i].sum())
        if held == 0:
            continue
        cells = " ".join(f"{n:>{width}}" for n in confusion[i])
        lines.append(f"{label:>{width}}         {cells}  {confusion[i, i] / held:.3f}")
    missing = [label for i, label in enumerate(labels) if confusion[i].sum() == 0]
    if missing:
        lines.append(f"no clips of: {', '.join(missing)}")
    return "\n".join(lines)
