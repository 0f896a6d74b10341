"""FedVMR's class-distribution gap, soft-target distillation, predicted counts, and train_local using them.

The terms themselves, on small tensors, and the settings they are built from: test_objectives.py.
"""

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedspeech.models import build_model
from fedspeech.models.clips.augment import DEFAULT_AUGMENTATION, NO_AUGMENTATION, augment_batch
from fedspeech.models.losses import class_distribution_kl, distillation_loss, predicted_counts
from fedspeech.models.norm import refresh_statistics
from fedspeech.models.objectives import ClassPrior, Distillation, terms_from_settings
from fedspeech.models.train import get_arrays, set_arrays, train_local
from fedspeech.protocol.messages import ModelSpec

TINY = ModelSpec("cnn", 8000, 2000, 3)  # 0.25 s clips at 8 kHz, three classes
TINY_BN = ModelSpec("cnn_bn", 8000, 2000, 3)


def _clips(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 0.1, (n, TINY.num_samples)).astype(np.float32)


def _mean_probabilities(model: nn.Module, waveforms: np.ndarray) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return torch.softmax(model(torch.from_numpy(waveforms)), dim=1).mean(dim=0)


def _kl(q: torch.Tensor, p: torch.Tensor) -> float:
    return float(torch.sum(q * (q / p).log()))


# class_distribution_kl


def test_class_distribution_kl_by_hand():
    logits = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    e = math.e
    q = [(1 / (1 + e) + e**2 / (e**2 + 1)) / 2, (e / (1 + e) + 1 / (e**2 + 1)) / 2]
    prior = [0.25, 0.75]
    expected = sum(qx * math.log(qx / px) for qx, px in zip(q, prior, strict=True))
    assert expected > 0.1  # a real gap, not a degenerate case
    actual = class_distribution_kl(logits, torch.tensor(prior))
    assert actual.shape == ()
    assert actual.item() == pytest.approx(expected, rel=1e-5)


def test_class_distribution_kl_is_zero_when_the_batch_mean_is_the_prior():
    # neither row is the prior, their mean is: the gap is measured on the batch's class distribution
    logits = torch.tensor([[0.2, 0.8], [0.4, 0.6]]).log()
    assert class_distribution_kl(logits, torch.tensor([0.3, 0.7])).item() == pytest.approx(0.0, abs=1e-6)
    assert class_distribution_kl(logits, torch.tensor([0.5, 0.5])).item() > 0.05


def test_class_distribution_kl_gradient_flows_and_stays_finite():
    logits = torch.tensor([[3.0, 0.0, -1.0], [2.0, 1.0, 0.0]], requires_grad=True)
    prior = torch.full((3,), 1 / 3)
    class_distribution_kl(logits, prior).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    # a gradient step lowers the gap
    stepped = (logits - 0.1 * logits.grad).detach()
    assert class_distribution_kl(stepped, prior) < class_distribution_kl(logits.detach(), prior)
    # a class whose probability underflows to zero in float32 adds nothing, not 0 * log 0 = nan
    extreme = torch.tensor([[200.0, -200.0, 0.0]], requires_grad=True)
    value = class_distribution_kl(extreme, prior)
    value.backward()
    assert value.item() == pytest.approx(math.log(3), rel=1e-5)
    assert extreme.grad is not None and torch.isfinite(extreme.grad).all()


def test_class_distribution_kl_rejects_a_prior_of_the_wrong_length():
    with pytest.raises(ValueError, match="prior"):
        class_distribution_kl(torch.zeros(4, 3), torch.tensor([0.5, 0.5]))


# distillation_loss


def test_distillation_at_temperature_one_is_soft_target_cross_entropy():
    generator = torch.Generator().manual_seed(0)
    student = torch.randn(5, 4, generator=generator)
    teacher = torch.randn(5, 4, generator=generator) * 3
    expected = nn.functional.cross_entropy(student, torch.softmax(teacher, dim=1))
    assert torch.allclose(distillation_loss(student, teacher, 1.0), expected, atol=1e-6)


def test_distillation_at_temperature_two_by_hand():
    student = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    teacher = torch.tensor([[0.0, 2.0], [4.0, 0.0]])
    # T = 2: teacher targets softmax([0, 1]) and softmax([2, 0]); student log-softmax([0.5, 0]) and ([0, 0])
    e = math.e
    targets = [[1 / (1 + e), e / (1 + e)], [e**2 / (e**2 + 1), 1 / (e**2 + 1)]]
    norm = math.log(math.exp(0.5) + 1)
    log_probs = [[0.5 - norm, -norm], [-math.log(2), -math.log(2)]]
    rows = [
        -sum(t * lp for t, lp in zip(ts, lps, strict=True))
        for ts, lps in zip(targets, log_probs, strict=True)
    ]
    expected = 2.0**2 * sum(rows) / 2
    assert distillation_loss(student, teacher, 2.0).item() == pytest.approx(expected, rel=1e-6)


# predicted_counts


class _Oracle(nn.Module):
    """Predicts the class stored in the first sample of each waveform."""

    def forward(self, waveforms: torch.Tensor) -> torch.Tensor:
        return 5.0 * nn.functional.one_hot(waveforms[:, 0].long(), 4).float()


def test_predicted_counts_exact_and_unsmoothed():
    waveforms = np.zeros((7, 10), dtype=np.float32)
    waveforms[:, 0] = [0, 2, 2, 0, 2, 1, 2]
    counts = predicted_counts(_Oracle(), waveforms, 4, batch_size=3)
    assert counts.dtype == np.int64
    assert counts.tolist() == [2, 1, 4, 0]  # confident: as counting; class 3 never: 0, not smoothed
    with pytest.raises(ValueError, match="classes"):
        predicted_counts(_Oracle(), waveforms, 3)


class _Unsure(nn.Module):
    """Probabilities (0.4, 0.3, 0.3) for every clip: class 0 most likely, never certain."""

    def forward(self, waveforms: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.tensor([0.4, 0.3, 0.3])).expand(len(waveforms), 3)


def test_predicted_counts_are_expected_counts_not_argmax_counts():
    counts = predicted_counts(_Unsure(), np.zeros((10, 4), dtype=np.float32), 3)
    assert counts.tolist() == [4, 3, 3], "argmax counting would say [10, 0, 0]"
    assert predicted_counts(_Unsure(), np.zeros((11, 4), dtype=np.float32), 3).sum() == 11


def test_predicted_counts_of_a_real_model_sum_to_the_clips():
    torch.manual_seed(0)
    model = build_model(TINY_BN)
    model.train()
    stats = {name: value.clone() for name, value in model.state_dict().items()}
    counts = predicted_counts(model, _clips(11, 0), 3, batch_size=4)
    assert counts.shape == (3,) and counts.sum() == 11
    assert model.training, "the model's mode is restored"
    assert all(torch.equal(stats[name], value) for name, value in model.state_dict().items()), "eval mode"


# train_local with the loss terms


def _reference_train(model, waveforms, labels, *, epochs, batch_size, learning_rate, seed):
    """train_local as it was before the class-prior and distillation terms existed.

    With one later change that is no loss term: BatchNorm's statistics are taken again at the end.
    """
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    targets = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    num_batches = max(1, len(waveforms) // batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * num_batches)
    model.train()
    for _ in range(epochs):
        for batch in np.array_split(rng.permutation(len(waveforms)), num_batches):
            augmented, _ = augment_batch(waveforms[batch], labels[batch], rng, DEFAULT_AUGMENTATION, 8000)
            inputs = torch.from_numpy(augmented)
            loss = nn.functional.cross_entropy(model(inputs), targets[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    refresh_statistics(model, waveforms, batch_size)
    model.eval()


def test_defaults_train_exactly_as_before():
    waveforms, labels = _clips(10, 1), np.arange(10) % 3
    torch.manual_seed(0)
    start = get_arrays(build_model(TINY_BN))
    runs = {}
    # the first round's settings of the class prior and of distillation: no prior nor teacher yet, no terms
    first_round = terms_from_settings({"prior_weight": 1.0, "distill_weight": 1.0}, num_classes=3)
    unused: dict[str, dict[str, Any]] = {"defaults": {}, "first round's terms": {"terms": first_round}}
    for name, extra in [("reference", None), *unused.items()]:
        model = build_model(TINY_BN)
        set_arrays(model, start)
        kwargs: dict[str, Any] = {"epochs": 2, "batch_size": 4, "learning_rate": 3e-3, "seed": 5}
        if extra is None:
            _reference_train(model, waveforms, labels, **kwargs)
        else:
            train_local(model, waveforms, labels, **kwargs, **extra)
        runs[name] = get_arrays(model)
    assert not np.array_equal(runs["reference"]["head.weight"], start["head.weight"])
    for name in unused:
        assert runs[name].keys() == runs["reference"].keys()
        assert all(np.array_equal(runs[name][k], v) for k, v in runs["reference"].items()), name


def test_class_prior_pulls_predictions_toward_it():
    waveforms, labels = _clips(12, 0), np.array([0] * 10 + [1, 2])  # skewed: mostly class 0
    prior = np.full(3, 1 / 3)
    torch.manual_seed(0)
    start = get_arrays(build_model(TINY))

    def gap(prior_weight: float) -> float:
        model = build_model(TINY)
        set_arrays(model, start)
        terms = [ClassPrior(prior_weight, tuple(prior))] if prior_weight else []
        train_local(model, waveforms, labels, epochs=6, batch_size=4, learning_rate=3e-3, terms=terms)
        return _kl(_mean_probabilities(model, waveforms), torch.tensor(prior, dtype=torch.float32))

    without, with_prior = gap(0.0), gap(3.0)
    assert without > 0.2, "the skewed labels skew the predictions"
    assert with_prior < 0.3 * without


def test_reported_loss_is_the_cross_entropy_alone():
    # clips not augmented; one batch, one step: the loss is the start's
    waveforms = np.repeat(np.linspace(-0.5, 0.5, 6, dtype=np.float32)[:, None], TINY.num_samples, axis=1)
    labels = np.array([0, 1, 2, 0, 1, 2])
    torch.manual_seed(0)
    start = get_arrays(build_model(TINY))
    model, teacher = build_model(TINY), build_model(TINY)
    set_arrays(model, start)
    with torch.no_grad():
        logits = model(torch.from_numpy(waveforms))
        expected_ce = nn.functional.cross_entropy(logits, torch.from_numpy(labels)).item()
        expected_distill = distillation_loss(logits, teacher(torch.from_numpy(waveforms)), 2.0).item()
    kwargs: dict[str, Any] = {"epochs": 1, "batch_size": 6, "learning_rate": 1e-3}
    kwargs["augmentation"] = NO_AUGMENTATION
    terms = [Distillation(2.0, teacher, temperature=2.0), ClassPrior(5.0, (0.1, 0.1, 0.8))]
    regularised = train_local(model, waveforms, labels, **kwargs, terms=terms)
    assert regularised.loss == pytest.approx(expected_ce, rel=1e-5)
    set_arrays(model, start)
    unlabelled = train_local(model, waveforms, None, **kwargs, terms=terms[::-1])  # the prior's term first
    assert unlabelled.loss == pytest.approx(expected_distill, rel=1e-5)


def test_distillation_without_labels_moves_the_student_to_the_teacher():
    waveforms = _clips(12, 10)
    torch.manual_seed(0)
    teacher = build_model(TINY_BN)
    with torch.no_grad():
        teacher.get_parameter("head.weight").mul_(10)  # confident outputs, far from the student's
    teacher.train()
    teacher_state = {name: value.clone() for name, value in teacher.state_dict().items()}
    student = build_model(TINY)

    def gap() -> float:
        teacher.eval(), student.eval()
        with torch.no_grad():
            inputs = torch.from_numpy(waveforms)
            target = torch.softmax(teacher(inputs), dim=1)
            log_probs = torch.log_softmax(student(inputs), dim=1)
            return float((target * (target.log() - log_probs)).sum(dim=1).mean())

    before = gap()
    teacher.train()
    result = train_local(
        student, waveforms, None, epochs=6, batch_size=4, learning_rate=3e-3,
        terms=[Distillation(1.0, teacher, temperature=2.0)],
    )  # fmt: skip
    assert not teacher.training, "the teacher ran in eval mode"
    assert np.isfinite(result.loss) and result.num_samples == 12
    assert gap() < 0.3 * before
    # the teacher's weights and batch statistics are untouched
    assert all(torch.equal(teacher_state[name], value) for name, value in teacher.state_dict().items())


def test_bad_arguments_are_refused():
    waveforms, labels = _clips(4, 0), np.array([0, 1, 2, 0])
    model = build_model(TINY)
    kwargs: dict[str, Any] = {"epochs": 1, "batch_size": 2, "learning_rate": 1e-3}
    with pytest.raises(ValueError, match="teacher"):
        train_local(model, waveforms, None, **kwargs)
    with pytest.raises(ValueError, match="teacher"):  # a prior gives unlabelled clips nothing to learn
        train_local(model, waveforms, None, **kwargs, terms=[ClassPrior(1.0, (0.2, 0.3, 0.5))])
    with pytest.raises(ValueError, match="own teacher"):
        train_local(model, waveforms, labels, **kwargs, terms=[Distillation(1.0, model)])
