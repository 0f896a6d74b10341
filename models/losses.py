"""Extra training objectives: FedVMR's class-distribution gap and soft-target distillation."""

import math

import numpy as np
import torch
from torch import Tensor, nn


def class_distribution_kl(logits: Tensor, prior: Tensor) -> Tensor:
    """KL(q || prior) with q the batch's mean softmax: FedVMR's class-distribution gap (a scalar).

    q is the predicted class distribution q_k^Y of the client's batch, prior the population's p
    (positive, summing to 1); the loss is differentiable through logits.
    """
    if prior.shape != logits.shape[1:]:
        raise ValueError(f"prior of shape {tuple(prior.shape)} for logits of shape {tuple(logits.shape)}")
    # log q from log-softmax, so that a class the batch all but ignores gives 0 * finite, not 0 * -inf
    log_q = torch.logsumexp(torch.log_softmax(logits, dim=1), dim=0) - math.log(len(logits))
    return torch.sum(log_q.exp() * (log_q - prior.to(log_q).log()))


def distillation_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """Soft-target cross-entropy at temperature T, times T^2 (Hinton et al. 2015), averaged over the batch.

    The T^2 keeps the gradient's size independent of T. Gradients reach teacher_logits too unless the
    caller detaches them.
    """
    targets = torch.softmax(teacher_logits / temperature, dim=1)
    log_probs = torch.log_softmax(student_logits / temperature, dim=1)
    return -(targets * log_probs).sum(dim=1).mean() * temperature**2


@torch.no_grad()
def predicted_counts(
    model: nn.Module, waveforms: np.ndarray, num_classes: int, batch_size: int = 256
) -> np.ndarray:
    """How many of the clips the model (in eval mode) expects in each class: int64, not smoothed.

    The counts are its predicted probabilities summed over the clips, rounded to whole clips that add up
    to their number (largest remainders). Summing probabilities rather than counting each clip's most
    likely class keeps a barely trained model's near-uniform guesses from reading as certainty about one
    class: fed back as the population distribution of FedVMR's regulariser, such certainty would pull
    every device towards that class.
    """
    waveforms = np.ascontiguousarray(waveforms, dtype=np.float32)
    was_training = model.training
    model.eval()
    expected = np.zeros(num_classes, dtype=np.float64)
    try:
        with torch.no_grad():
            for i in range(0, len(waveforms), batch_size):
                logits = model(torch.from_numpy(waveforms[i : i + batch_size]))
                if logits.shape[1] != num_classes:
                    raise ValueError(f"the model has {logits.shape[1]} classes, expected {num_classes}")
                expected += logits.double().softmax(dim=1).sum(dim=0).numpy()
    finally:
        model.train(was_training)
    counts = np.floor(expected).astype(np.int64)
    short = len(waveforms) - int(counts.sum())
    counts[np.argsort(counts - expected)[:short]] += 1  # the largest remainders first
    return counts
