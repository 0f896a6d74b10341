"""What a method adds to local training: loss terms, a time budget, and the task settings each reads.

Local training minimises the cross-entropy plus, for each loss term, weight * value on the same batch.
A term is a frozen dataclass that declares the task settings it reads (SETTINGS), the rules those
settings must keep together (check) and how it is built from them (from_settings). TERMS lists them; a
device accepts their settings and the few it honours around a run (local_norm, local_statistics), and
refuses any other. A new term is one class here and its name in TERMS.

torch is imported only when a run starts, so a device checks a task's settings without loading it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self, cast

import numpy as np

from fedspeech.protocol.bounds import MAX_TASK_SECONDS

if TYPE_CHECKING:
    from torch import Tensor, nn

PRIOR_TOLERANCE = 1e-6  # how far from 1 a class prior's sum may be

BatchValue = Callable[["Tensor", "Tensor"], "Tensor"]  # a term's value on a batch: (inputs, logits) -> scalar


class UnknownSetting(ValueError):
    """A task asks for a training setting this device does not know or does not accept."""


@dataclass(frozen=True)
class Number:
    """A numeric task setting and the inclusive bounds a device accepts."""

    name: str
    low: float
    high: float

    def check(self, value: object, num_classes: int = 0) -> None:
        """UnknownSetting unless value is a number within the bounds (num_classes does not change them)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UnknownSetting(f"training setting {self.name} must be a number, not {str(value)[:80]}")
        if not self.low <= value <= self.high:
            raise UnknownSetting(
                f"training setting {self.name} = {value} is outside [{self.low}, {self.high}]"
            )


@dataclass(frozen=True)
class Distribution:
    """A task setting that gives each class a probability: a list of positive numbers summing to 1."""

    name: str

    def check(self, value: object, num_classes: int) -> None:
        """UnknownSetting unless value is a list of num_classes finite positive numbers summing to 1."""
        if not isinstance(value, list) or len(value) != num_classes:
            raise UnknownSetting(
                f"{self.name} must be a list of {num_classes} numbers, not {str(value)[:80]}"
            )
        if not all(isinstance(p, int | float) and not isinstance(p, bool) for p in value):
            raise UnknownSetting(f"{self.name} must hold numbers only, not {str(value)[:80]}")
        prior = np.asarray(value, dtype=np.float64)
        if not (np.isfinite(prior).all() and (prior > 0).all()):
            raise UnknownSetting(f"{self.name} must hold finite positive probabilities")
        if abs(prior.sum() - 1.0) > PRIOR_TOLERANCE:
            raise UnknownSetting(f"{self.name} sums to {prior.sum()}, not 1")


Setting = Number | Distribution


class Term(ABC):
    """Something a task's settings add to local training: a loss term, or a limit on the run."""

    SETTINGS: ClassVar[tuple[Setting, ...]]  # the task settings it reads

    @classmethod
    def check(cls, config: Mapping[str, Any], teacher: bool) -> None:
        """UnknownSetting if the settings break a rule of this term (none by default; each value is checked).

        teacher: whether the task names a teacher model.
        """
        return None

    @classmethod
    @abstractmethod
    def from_settings(cls, config: Mapping[str, Any], teacher: nn.Module | None) -> Self | None:
        """The term checked settings ask for, None if they ask for none."""


class LossTerm(Term):
    """weight * value, added to each batch's loss."""

    weight: float
    replaces_labels: ClassVar[bool] = False  # it gives unlabelled clips something to learn

    @abstractmethod
    def start(self, model: nn.Module) -> BatchValue:
        """Called once before a run's first batch: the term's unweighted value on each batch."""


@dataclass(frozen=True)
class Proximal(LossTerm):
    """FedProx's proximal term (Li et al. 2020): mu/2 * ||w - w_start||^2, keeping a model near its start.

    weight is FedProx's mu; the value is half the squared distance from the weights the run started at.
    """

    weight: float

    SETTINGS = (Number("proximal_mu", 0.0, 100.0),)

    @classmethod
    def from_settings(cls, config: Mapping[str, Any], teacher: nn.Module | None) -> Self | None:
        """A proximal term for proximal_mu > 0."""
        mu = config.get("proximal_mu", 0.0)
        return cls(float(mu)) if mu else None

    def start(self, model: nn.Module) -> BatchValue:
        """Half the squared distance of the model's parameters from those it has now."""
        anchor = [p.detach().clone() for p in model.parameters()]

        def value(inputs: Tensor, logits: Tensor) -> Tensor:
            drift = sum((p - a).square().sum() for p, a in zip(model.parameters(), anchor, strict=True))
            return cast("Tensor", 0.5 * drift)

        return value


@dataclass(frozen=True)
class ClassPrior(LossTerm):
    """FedVMR's class-distribution regulariser: KL(q || prior), q the batch's mean prediction.

    prior is the population's class distribution (positive, scaled to sum 1 when the run starts); the
    class_prior strategy sends it from the second round on, with prior_weight as the weight.
    """

    weight: float
    prior: tuple[float, ...]

    SETTINGS = (Number("prior_weight", 0.0, 100.0), Distribution("class_prior"))

    def __post_init__(self) -> None:
        prior = np.asarray(self.prior, dtype=np.float64)
        if prior.ndim != 1 or not np.all(np.isfinite(prior)) or not np.all(prior > 0):
            raise ValueError(f"class_prior must be a vector of positive numbers, not {self.prior!r}")

    @classmethod
    def check(cls, config: Mapping[str, Any], teacher: bool) -> None:
        """class_prior needs its weight."""
        if "class_prior" in config and "prior_weight" not in config:
            raise UnknownSetting("class_prior without prior_weight")

    @classmethod
    def from_settings(cls, config: Mapping[str, Any], teacher: nn.Module | None) -> Self | None:
        """The regulariser once there is a class_prior (not in the first round) and prior_weight > 0."""
        if "class_prior" not in config or not config["prior_weight"]:
            return None
        return cls(float(config["prior_weight"]), tuple(float(p) for p in config["class_prior"]))

    def start(self, model: nn.Module) -> BatchValue:
        """The gap between the batch's mean prediction and the prior."""
        import torch

        from fedspeech.models.losses import class_distribution_kl

        prior = np.asarray(self.prior, dtype=np.float64)
        target = torch.from_numpy((prior / prior.sum()).astype(np.float32))
        return lambda inputs, logits: class_distribution_kl(logits, target)


@dataclass(frozen=True)
class Distillation(LossTerm):
    """Mutual knowledge distillation's term: the soft-target loss towards a teacher's outputs at temperature.

    The teacher is put (and left) in eval mode and run without gradients: it never changes. With no
    labels, the term alone is learned (the server side of mutual knowledge distillation).
    """

    weight: float
    teacher: nn.Module
    temperature: float = 1.0

    SETTINGS = (Number("distill_weight", 0.0, 100.0), Number("distill_temperature", 0.05, 100.0))
    replaces_labels = True

    def __post_init__(self) -> None:
        if self.teacher is None:
            raise ValueError("distillation needs a teacher")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, not {self.temperature}")

    @classmethod
    def check(cls, config: Mapping[str, Any], teacher: bool) -> None:
        """A teacher needs distill_weight.

        The settings without a teacher are allowed: the first round, before the server has a model to send.
        """
        if teacher and "distill_weight" not in config:
            raise UnknownSetting("a teacher model without distill_weight")

    @classmethod
    def from_settings(cls, config: Mapping[str, Any], teacher: nn.Module | None) -> Self | None:
        """The term once there is a teacher and distill_weight > 0."""
        if teacher is None or not config["distill_weight"]:
            return None
        return cls(float(config["distill_weight"]), teacher, float(config.get("distill_temperature", 1.0)))

    def start(self, model: nn.Module) -> BatchValue:
        """The distillation loss towards the teacher's outputs on the same batch; ValueError for the model."""
        import torch

        from fedspeech.models.losses import distillation_loss

        if self.teacher is model:
            raise ValueError("a model cannot be its own teacher")
        teacher, temperature = self.teacher, self.temperature
        teacher.eval()

        def value(inputs: Tensor, logits: Tensor) -> Tensor:
            with torch.no_grad():
                teacher_logits = teacher(inputs)
            return distillation_loss(logits, teacher_logits, temperature)

        return value


@dataclass(frozen=True)
class TimeBudget(Term):
    """Not a loss: the run ends after the first batch that finishes past these seconds.

    The epochs stay the most it trains; the learning rate follows its cosine over the budget's time
    instead of the steps.
    """

    seconds: float

    SETTINGS = (Number("time_budget_s", 0.1, float(MAX_TASK_SECONDS)),)

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"a time budget must be positive, not {self.seconds}")

    @classmethod
    def from_settings(cls, config: Mapping[str, Any], teacher: nn.Module | None) -> Self | None:
        """A budget when time_budget_s is set."""
        return cls(float(config["time_budget_s"])) if "time_budget_s" in config else None


# every term a device knows, in the order their values are added to a batch's loss (a budget adds none)
TERMS: tuple[type[Term], ...] = (Distillation, ClassPrior, Proximal, TimeBudget)


def term_settings() -> list[Setting]:
    """The task settings the terms read."""
    return [setting for kind in TERMS for setting in kind.SETTINGS]


def check_settings(
    config: Mapping[str, Any], num_classes: int, teacher: bool, others: Sequence[Setting] = ()
) -> None:
    """UnknownSetting for a setting no term reads (nor others), a value it does not accept, or a broken rule.

    teacher: whether the task names a teacher model; others: settings read outside the terms.
    """
    known = {setting.name: setting for setting in [*term_settings(), *others]}
    for name, value in config.items():
        if name not in known:
            raise UnknownSetting(f"unknown training setting {name!r} (known: {', '.join(known)})")
        known[name].check(value, num_classes)
    for kind in TERMS:
        kind.check(config, teacher)


def terms_from_settings(
    config: Mapping[str, Any],
    num_classes: int,
    teacher: nn.Module | None = None,
    others: Sequence[Setting] = (),
) -> list[Term]:
    """The terms a task's settings ask for, in TERMS' order; UnknownSetting as check_settings."""
    check_settings(config, num_classes, teacher is not None, others)
    return [term for kind in TERMS if (term := kind.from_settings(config, teacher)) is not None]
