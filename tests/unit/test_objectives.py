"""The loss terms on small tensors against their formulas, and the task settings they are built from."""

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedspeech.models.losses import distillation_loss
from fedspeech.models.objectives import (
    PRIOR_TOLERANCE,
    TERMS,
    ClassPrior,
    Distillation,
    Distribution,
    Number,
    Proximal,
    TimeBudget,
    UnknownSetting,
    check_settings,
    term_settings,
    terms_from_settings,
)


class Fixed(nn.Module):
    """Answers every batch with the same logits; one parameter, to see whether gradients reach it."""

    def __init__(self, logits: list[list[float]]) -> None:
        super().__init__()
        self.logits = torch.tensor(logits)
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.scale * self.logits


INPUTS = torch.zeros(2, 4)  # what the model saw; Fixed ignores it


# the terms' values


def test_proximal_is_half_the_squared_distance_from_the_start():
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]]))
        model.bias.fill_(0.5)
    value = Proximal(0.3).start(model)
    assert value(INPUTS, torch.zeros(2, 1)).item() == 0.0
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.5, -2.0]]))  # moved by 0.5 and, below, by -1
        model.bias.fill_(-0.5)
    drift = value(INPUTS, torch.zeros(2, 1))
    assert drift.item() == pytest.approx(0.5 * (0.5**2 + 1.0**2))
    drift.backward()
    assert model.weight.grad is not None and model.bias.grad is not None
    assert model.weight.grad.tolist() == [[0.5, 0.0]]  # w - w_start, exact in binary
    assert model.bias.grad.item() == -1.0


def test_class_prior_is_the_gap_of_the_batch_mean_from_the_scaled_prior():
    logits = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    e = math.e
    q = [(1 / (1 + e) + e**2 / (e**2 + 1)) / 2, (e / (1 + e) + 1 / (e**2 + 1)) / 2]
    expected = q[0] * math.log(q[0] / 0.25) + q[1] * math.log(q[1] / 0.75)
    value = ClassPrior(2.0, (1.0, 3.0)).start(nn.Linear(1, 2))  # scaled to (0.25, 0.75)
    assert value(INPUTS, logits).item() == pytest.approx(expected, rel=1e-5)


def test_distillation_is_the_soft_target_loss_towards_the_teacher_at_temperature():
    teacher = Fixed([[0.0, 2.0], [4.0, 0.0]])
    teacher.train()
    value = Distillation(0.5, teacher, temperature=2.0).start(nn.Linear(1, 2))
    assert not teacher.training, "the teacher runs in eval mode"
    student = torch.tensor([[1.0, 0.0], [0.0, 0.0]], requires_grad=True)
    loss = value(INPUTS, student)
    # the loss of the teacher's logits at T = 2, which test_losses works out by hand
    expected = distillation_loss(student.detach(), torch.tensor([[0.0, 2.0], [4.0, 0.0]]), 2.0)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    assert student.grad is not None and teacher.scale.grad is None, "only the student learns"


def test_a_model_is_not_its_own_teacher():
    model = nn.Linear(1, 2)
    with pytest.raises(ValueError, match="own teacher"):
        Distillation(1.0, model).start(model)


def test_only_distillation_replaces_labels():
    assert [kind.__name__ for kind in TERMS if getattr(kind, "replaces_labels", False)] == ["Distillation"]


@pytest.mark.parametrize(
    "build",
    [
        lambda: ClassPrior(1.0, (0.5, 0.0, 0.5)),
        lambda: ClassPrior(1.0, (0.5, -0.1)),
        lambda: ClassPrior(1.0, (0.5, math.nan)),
        lambda: Distillation(1.0, nn.Linear(1, 2), temperature=0.0),
        lambda: Distillation(1.0, None),  # type: ignore[arg-type]
        lambda: TimeBudget(0.0),
    ],
    ids=["prior with a zero", "negative prior", "nan prior", "temperature 0", "no teacher", "no time"],
)
def test_a_term_refuses_values_it_cannot_use(build: Any) -> None:
    with pytest.raises(ValueError, match="class_prior|temperature|teacher|budget"):
        build()


# the settings


NUMBERS = [setting for setting in term_settings() if isinstance(setting, Number)]


@pytest.mark.parametrize("setting", NUMBERS, ids=[s.name for s in NUMBERS])
def test_every_numeric_setting_is_held_to_its_bounds(setting: Number) -> None:
    for accepted in (setting.low, setting.high, int(setting.high)):
        check_settings({setting.name: accepted}, num_classes=3, teacher=False)
    for refused in (np.nextafter(setting.low, -math.inf), np.nextafter(setting.high, math.inf), math.nan):
        with pytest.raises(UnknownSetting, match="outside"):
            check_settings({setting.name: float(refused)}, num_classes=3, teacher=False)
    for refused in ("1", True, [setting.low]):
        with pytest.raises(UnknownSetting, match="must be a number"):
            check_settings({setting.name: refused}, num_classes=3, teacher=False)


BAD_PRIORS = {
    "too short": [0.5, 0.5],
    "not a list": 0.5,
    "a string in it": [0.5, "0.25", 0.25],
    "a bool in it": [True, 0.0, 0.0],
    "a zero": [0.0, 0.5, 0.5],
    "infinite": [math.inf, 0.5, 0.5],
    "summing to 1.01": [0.34, 0.34, 0.33],
}


@pytest.mark.parametrize("value", BAD_PRIORS.values(), ids=BAD_PRIORS.keys())
def test_a_class_prior_is_a_distribution_over_the_classes(value: Any) -> None:
    with pytest.raises(UnknownSetting, match="class_prior"):
        Distribution("class_prior").check(value, num_classes=3)


def test_a_class_prior_may_miss_1_by_the_tolerance():
    Distribution("class_prior").check([0.25, 0.25, 0.5 + PRIOR_TOLERANCE / 2], num_classes=3)
    with pytest.raises(UnknownSetting, match="sums to"):
        Distribution("class_prior").check([0.25, 0.25, 0.5 + PRIOR_TOLERANCE * 2], num_classes=3)


def test_settings_no_term_reads_are_refused_with_the_known_ones_named():
    with pytest.raises(UnknownSetting, match="unknown training setting 'momentum'") as refused:
        check_settings({"momentum": 0.9}, num_classes=3, teacher=False)
    assert all(setting.name in str(refused.value) for setting in term_settings())
    local = Number("local_norm", 0.0, 1.0)  # a setting read outside the terms, given by the caller
    check_settings({"local_norm": 1.0}, num_classes=3, teacher=False, others=[local])
    with pytest.raises(UnknownSetting, match="local_norm"):
        check_settings({"local_norm": 1.0}, num_classes=3, teacher=False)


def test_the_rules_between_settings():
    with pytest.raises(UnknownSetting, match="a teacher model without distill_weight"):
        check_settings({"distill_temperature": 2.0}, num_classes=2, teacher=True)
    with pytest.raises(UnknownSetting, match="class_prior without prior_weight"):
        check_settings({"class_prior": [0.5, 0.5]}, num_classes=2, teacher=False)
    # distillation's settings before there is a teacher: the first round
    check_settings({"distill_weight": 1.0}, num_classes=2, teacher=False)


def test_settings_become_terms_in_the_order_of_the_list():
    teacher = nn.Linear(1, 3)
    config = {
        "time_budget_s": 30,
        "proximal_mu": 0.01,
        "class_prior": [0.2, 0.3, 0.5],
        "prior_weight": 2,
        "distill_temperature": 3.0,
        "distill_weight": 0.5,
    }
    terms = terms_from_settings(config, num_classes=3, teacher=teacher)
    assert terms == [
        Distillation(0.5, teacher, temperature=3.0),
        ClassPrior(2.0, (0.2, 0.3, 0.5)),
        Proximal(0.01),
        TimeBudget(30.0),
    ]
    assert [type(term) for term in terms] == list(TERMS)
    assert terms_from_settings({"distill_weight": 1.0}, 3, teacher) == [Distillation(1.0, teacher, 1.0)]


FIRST_ROUNDS_AND_ZERO_WEIGHTS = {
    "nothing": {},
    "prior's weight before there is a prior": {"prior_weight": 1.0},
    "distillation before there is a teacher": {"distill_weight": 1.0, "distill_temperature": 2.0},
    "zero mu": {"proximal_mu": 0.0},
    "zero prior weight": {"prior_weight": 0.0, "class_prior": [0.5, 0.5]},
}


@pytest.mark.parametrize(
    "config", FIRST_ROUNDS_AND_ZERO_WEIGHTS.values(), ids=FIRST_ROUNDS_AND_ZERO_WEIGHTS.keys()
)
def test_settings_that_ask_for_nothing_give_no_terms(config: dict[str, Any]) -> None:
    assert terms_from_settings(config, num_classes=2) == []


def test_a_zero_distillation_weight_gives_no_term_even_with_a_teacher():
    assert terms_from_settings({"distill_weight": 0.0}, 2, nn.Linear(1, 2)) == []
