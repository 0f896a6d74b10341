"""The local training step, evaluation, and moving weights between a model and named numpy arrays."""

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedspeech.models import losses, scores
from fedspeech.models.clips.augment import DEFAULT_AUGMENTATION, Augmentation, augment_batch
from fedspeech.models.norm import refresh_statistics


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


def _prior(class_prior: np.ndarray | None) -> torch.Tensor:
    """The class prior as a float32 probability vector; ValueError unless it is positive."""
    if class_prior is None:
        raise ValueError("prior_weight > 0 needs a class_prior")
    prior = np.asarray(class_prior, dtype=np.float64)
    if prior.ndim != 1 or not np.all(np.isfinite(prior)) or not np.all(prior > 0):
        raise ValueError(f"class_prior must be a vector of positive numbers, not {class_prior!r}")
    return torch.from_numpy((prior / prior.sum()).astype(np.float32))


def _teacher(model: nn.Module, teacher: nn.Module | None, temperature: float) -> nn.Module:
    """The teacher to distil from; ValueError if there is none, it is the student, or T is not positive."""
    if teacher is None:
        raise ValueError("distill_weight > 0 needs a teacher")
    if teacher is model:
        raise ValueError("a model cannot be its own teacher")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, not {temperature}")
    return teacher


def _objective(
    logits: torch.Tensor,
    targets: torch.Tensor | None,
    teacher_logits: torch.Tensor | None,
    distill_weight: float,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's loss before regularisers, and the part reported: cross-entropy, else distillation."""
    if teacher_logits is None:
        if targets is None:
            raise ValueError("no labels and no teacher")
        cross_entropy = nn.functional.cross_entropy(logits, targets)
        return cross_entropy, cross_entropy
    distill = losses.distillation_loss(logits, teacher_logits, temperature)
    if targets is None:
        return distill_weight * distill, distill
    cross_entropy = nn.functional.cross_entropy(logits, targets)
    return cross_entropy + distill_weight * distill, cross_entropy


def train_local(
    model: nn.Module,
    waveforms: np.ndarray,
    labels: np.ndarray | None,
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int = 0,
    proximal_mu: float = 0.0,
    should_stop: Callable[[], bool] | None = None,
    class_prior: np.ndarray | None = None,
    prior_weight: float = 0.0,
    teacher: nn.Module | None = None,
    distill_weight: float = 0.0,
    temperature: float = 1.0,
    augmentation: Augmentation | None = None,
    noise: np.ndarray | None = None,
    none_class: int | None = None,
    time_budget_s: float | None = None,
) -> TrainResult:
    """Train in place: Adam, cosine-decayed lr, shuffled augmented minibatches; deterministic per seed.

    Each batch is augmented (models.clips.augment): clips placed anywhere in the window and mixed with white
    noise or windows of noise (the background pool, (N, num_samples)) at random SNRs; with labels and a
    none_class, background windows labelled none_class are added to it. augmentation None takes the
    model's own `augmentation` attribute where it has one, else the default.

    proximal_mu > 0 adds FedProx's term mu/2 * ||w - w_start||^2, keeping the model near where it started.
    prior_weight > 0 adds prior_weight * KL(q || class_prior), q the batch's mean prediction (FedVMR's
    class-distribution regulariser; class_prior is the population's class distribution, scaled to sum 1).
    distill_weight > 0 adds distill_weight * the distillation loss towards teacher's outputs at temperature
    on the same batch; the teacher is put (and left) in eval mode, without gradients: it never changes.
    labels None trains on the distillation term alone (mutual knowledge distillation's server side).
    The reported loss is the cross-entropy, or the distillation loss when there are no labels.
    should_stop is asked before each batch; when it answers True, Interrupted is raised.
    time_budget_s ends the run after the first batch that finishes past it (epochs stay the most it
    trains), the learning rate following the cosine over the budget's time instead of the steps.
    BatchNorm's running statistics are taken again at the trained weights over the clean clips
    (norm.refresh_statistics); the time this takes is counted in the run's seconds.
    """
    if len(waveforms) == 0:
        raise ValueError("no training samples")
    prior = _prior(class_prior) if prior_weight > 0 else None
    distiller = _teacher(model, teacher, temperature) if distill_weight > 0 else None
    if labels is None and distiller is None:
        raise ValueError("without labels, give a teacher and distill_weight > 0 to learn its outputs")
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
    anchor = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else []
    if distiller is not None:
        distiller.eval()
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
        teacher_logits = None
        if distiller is not None:
            with torch.no_grad():
                teacher_logits = distiller(inputs)
        batch_labels = None if batch_targets is None else torch.from_numpy(batch_targets)
        loss, reported = _objective(logits, batch_labels, teacher_logits, distill_weight, temperature)
        recent.append((reported.item() * len(inputs), len(inputs)))
        if prior is not None:
            loss = loss + prior_weight * losses.class_distribution_kl(logits, prior)
        if anchor:
            drift = sum((p - a).square().sum() for p, a in zip(model.parameters(), anchor, strict=True))
            loss = loss + proximal_mu / 2 * drift
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
    """Predicted classes and per-clip cross-entropy of the model in eval mode."""
    if len(waveforms) == 0:
        raise ValueError("no samples to evaluate")
    waveforms = np.ascontiguousarray(waveforms, dtype=np.float32)
    model.eval()
    logits = torch.cat(
        [model(torch.from_numpy(waveforms[i : i + batch_size])) for i in range(0, len(waveforms), batch_size)]
    )
    targets = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    per_clip = nn.functional.cross_entropy(logits, targets, reduction="none")
    return logits.argmax(dim=1).numpy(), per_clip.numpy()


def evaluate(
    model: nn.Module, waveforms: np.ndarray, labels: np.ndarray, batch_size: int = 256
) -> EvalResult:
    """Accuracy, macro-F1 and loss of the model in eval mode."""
    labels = np.asarray(labels, dtype=np.int64)
    predictions, losses = predict(model, waveforms, labels, batch_size)
    num_classes = int(max(labels.max(), predictions.max())) + 1
    confusion = scores.confusion_matrix(labels, predictions, num_classes)
    return EvalResult(
        accuracy=scores.accuracy(confusion),
        macro_f1=scores.macro_f1(confusion),
        loss=float(losses.mean()),
        predictions=predictions,
    )
