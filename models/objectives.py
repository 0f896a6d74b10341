"""The task settings of local training's loss terms, checked as a device receives them."""

import numpy as np

PRIOR_TOLERANCE = 1e-6  # how far from 1 a class prior's sum may be


class UnknownSetting(ValueError):
    """A task asks for a training setting this device does not know or does not accept."""


def check_class_prior(value: object, num_classes: int) -> None:
    """UnknownSetting unless value is a list of num_classes finite positive numbers summing to 1."""
    if not isinstance(value, list) or len(value) != num_classes:
        raise UnknownSetting(f"class_prior must be a list of {num_classes} numbers, not {str(value)[:80]}")
    if not all(isinstance(p, int | float) and not isinstance(p, bool) for p in value):
        raise UnknownSetting(f"class_prior must hold numbers only, not {str(value)[:80]}")
    prior = np.asarray(value, dtype=np.float64)
    if not (np.isfinite(prior).all() and (prior > 0).all()):
        raise UnknownSetting("class_prior must hold finite positive probabilities")
    if abs(prior.sum() - 1.0) > PRIOR_TOLERANCE:
        raise UnknownSetting(f"class_prior sums to {prior.sum()}, not 1")
