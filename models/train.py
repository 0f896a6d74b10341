"""The local training step, evaluation, and moving weights between a model and named numpy arrays."""

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedspeech.models import scores
from fedspeech.models.clips.augment import DEFAULT_AUGMENTATION, Augmentation, augment_batch
from fedspeech.models.norm import refresh_statistics
from fedspeech.models.objectives import BatchValue, LossTerm, Term, TimeBudget


def _float_names(model: nn.Module) -> list[str]:
    return [name for name, tensor in model.state_dict().items() if tensor.is_floating_point()]


def get_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    """The state dict's floating-point tensors as numpy copies (integer buffers like BN counters skipped)."""
    state = model.state_dict()
    return {name: state[name].detach().cpu().numpy().copy() for name in _float_names(model)}


def set_arrays(model: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Load named arrays into the model; the names must be exactly its floating-point tensors."""
    expected = set(_float_names(model))
    missing, extra = expected - arrays.keys(), arrays.keys() - expected
    if missing or extra:
        raise ValueError(f"tensor names differ: missing {sorted(missing)}, unexpected {sorted(extra)}")
    state = {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in arrays.items()}
    model.load_state_dict(state, strict=False)


# torch.export keeps the node it is tracing in a module global (torch.fx.traceback.current_meta) that the
# optimiser's calls write as well, so an export in one thread and a training step in another corrupt it
# (KeyError 'custom' in zero_grad): the coordinator exports while a device daemon or its own server-side
# training may run in the same process. Both hold this lock, a training step only for its update.
TORCH_TRACING = threading.Lock()


class Interrupted(Exception):
    """train_local stopped between two batches because its should_stop said so; the model is half trained."""


@dataclass
class TrainResult:
    """What a local training run did: samples per epoch, its last epoch's mean loss, wall time and steps."""

    num_samples: int
    loss: float
    seconds: float
    seconds_per_sample: float
    steps: int = 0  # optimiser steps taken


@dataclass
class EvalResult:
    """Accuracy, macro-F1 and mean cross-entropy on a labelled set, with the predicted classes."""

    accuracy: float
    macro_f1: float
    loss: float
    predictions: np.ndarray


def _sample_rate(model: nn.Module) -> int:
    """The rate of the model's input, from its front-end (every fedspeech model starts with a LogMel)."""
    rate = getattr(getattr(model, "frontend", None), "sample_rate", None)
    if not isinstance(rate, int):
        raise ValueError("the model has no front-end that tells its sample rate")
    return rate


def _batch_loss(
    inputs: torch.Tensor,
    logits: torch.Tensor,
    targets: torch.Tensor | None,
    terms: Sequence[tuple[LossTerm, BatchValue]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's loss, the cross-entropy plus each term's weight * value, and the part reported.

    The part reported is the cross-entropy, or without labels the value of the term that replaces them.
    """
    # the terms' values are made before the cross-entropy: autograd sums the gradients meeting at the
    # logits in an order set by when each part was made, and this order keeps the results as they were
    values = [(term, value_of(inputs, logits)) for term, value_of in terms]
    loss = reported = None if targets is None else nn.functional.cross_entropy(logits, targets)
    for term, value in values:
        if reported is None and term.replaces_labels:
            reported = value
        loss = term.weight * value if loss is None else loss + term.weight * value
    if loss is None or reported is None:
        raise ValueError("no labels, and no term that replaces them")
    return loss, reported


def train_local(
    model: nn.Module,
    waveforms: np.ndarray,
    labels: np.ndarray | None,
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int = 0,
    terms: Sequence[Term] = (),
    should_stop: Callable[[], bool] | None = None,
    augmentation: Augmentation | None = None,
    noise: np.ndarray | None = None,
    none_class: int | None = None,
) -> TrainResult:
    """Train in place: Adam, cosine-decayed lr, shuffled augmented minibatches; deterministic per seed.

    Each batch is augmented (models.clips.augment): clips placed anywhere in the window and mixed with white
    noise or windows of noise (the background pool, (N, num_samples)) at random SNRs; with labels and a
    none_class, background windows labelled none_class are added to it. augmentation None takes the
    model's own `augmentation` attribute where it has one, else the default.

    Each loss term among terms (models.objectives) adds its weight * value on the batch, in their order;
    labels None trains on the terms alone, which must include one that replaces labels (distillation).
    The reported loss is the cross-entropy, or that term's value when there are no labels. A TimeBudget
    among terms ends the run after the first batch that finishes past it (epochs stay the most it
    trains), the learning rate following the cosine over the budget's time instead of the steps.
    should_stop is asked before each batch; when it answers True, Interrupted is raised.
    BatchNorm's running statistics are taken again at the trained weights over the clean clips
    (norm.refresh_statistics); the time this takes is counted in the run's seconds.
    """
    if len(waveforms) == 0:
        raise ValueError("no training samples")
    loss_terms = [term for term in terms if isinstance(term, LossTerm)]
    if labels is None and not any(term.replaces_labels for term in loss_terms):
        raise ValueError("without labels, give a term that replaces them: a teacher's outputs to distil")
    budgets = [term.seconds for term in terms if isinstance(term, TimeBudget)]
    time_budget_s = min(budgets) if budgets else None
    if augmentation is None:
        augmentation = getattr(model, "augmentation", DEFAULT_AUGMENTATION)
    waveforms = np.ascontiguousarray(waveforms, dtype=np.float32)
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    targets = None if labels is None else np.asarray(labels, dtype=np.int64)
    pool = None if noise is None else np.ascontiguousarray(noise, dtype=np.float32)
    sample_rate = _sample_rate(model)
    num_batches = max(1, len(waveforms) // batch_size)
    # decaying to zero at the end of the run settles the weights before they are sent
    total_steps = epochs * num_batches
    started = [(term, term.start(model)) for term in loss_terms]
    model.train()

    def batches() -> Iterator[np.ndarray]:
        for _ in range(epochs):
            yield from np.array_split(rng.permutation(len(waveforms)), num_batches)

    recent: deque[tuple[float, int]] = deque(maxlen=num_batches)  # an epoch's worth of batch losses
    start = time.perf_counter()
    steps = 0
    for batch in batches():
        if should_stop is not None and should_stop():
            raise Interrupted("stopped between two batches")
        elapsed = time.perf_counter() - start
        if time_budget_s is not None and steps and elapsed >= time_budget_s:
            break
        done = steps / total_steps if time_budget_s is None else min(1.0, elapsed / time_budget_s)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate * 0.5 * (1.0 + math.cos(math.pi * done))
        batch_targets = None if targets is None else targets[batch]
        augmented, batch_targets = augment_batch(
            waveforms[batch], batch_targets, rng, augmentation, sample_rate, pool, none_class
        )
        inputs = torch.from_numpy(augmented)
        logits = model(inputs)
        batch_labels = None if batch_targets is None else torch.from_numpy(batch_targets)
        loss, reported = _batch_loss(inputs, logits, batch_labels, started)
        recent.append((reported.item() * len(inputs), len(inputs)))
        with TORCH_TRACING:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        steps += 1
    refresh_statistics(model, waveforms, batch_size)
    seconds = time.perf_counter() - start
    model.eval()
    mean_loss = sum(t for t, _ in recent) / sum(n for _, n in recent)
    seen = steps * len(waveforms) / num_batches  # samples trained on, the last epoch perhaps in part
    return TrainResult(len(waveforms), mean_loss, seconds, seconds / seen, steps)


@torch.no_grad()
def predict(
    model: nn.Module, waveforms: np.ndarray, labels: np.ndarray, batch_size: int = 256
) -> tuple[np.ndarray, np.ndarray]:
    """Class probabilities (clips, classes) and per-clip cross-entropy of the model in eval mode."""
    if len(waveforms) == 0:
        raise ValueError("no samples to evaluate")
    waveforms = np.ascontiguousarray(waveforms, dtype=np.float32)
    model.eval()
    logits = torch.cat(
        [model(torch.from_numpy(waveforms[i : i + batch_size])) for i in range(0, len(waveforms), batch_size)]
    )
    targets = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    per_clip = nn.functional.cross_entropy(logits, targets, reduction="none")
    return torch.softmax(logits, dim=1).numpy(), per_clip.numpy()


def evaluate(
    model: nn.Module, waveforms: np.ndarray, labels: np.ndarray, batch_size: int = 256
) -> EvalResult:
    """Accuracy, macro-F1 and loss of the model in eval mode."""
    return scored(*predict(model, waveforms, labels, batch_size), labels)


def scored(probabilities: np.ndarray, losses: np.ndarray, labels: np.ndarray) -> EvalResult:
    """Accuracy, macro-F1 and mean loss of predictions (predict's probabilities and losses) against labels."""
    labels = np.asarray(labels, dtype=np.int64)
    predictions = probabilities.argmax(axis=1)
    num_classes = int(max(labels.max(), predictions.max())) + 1
    confusion = scores.confusion_matrix(labels, predictions, num_classes)
    return EvalResult(
        accuracy=scores.accuracy(confusion),
        macro_f1=scores.macro_f1(confusion),
        loss=float(losses.mean()),
        predictions=predictions,
    )
