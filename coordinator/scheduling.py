"""Scheduling: how many local epochs each selected device trains in a round."""

import math
from collections.abc import Iterable, Mapping


def fixed_epochs(devices: Iterable[str], epochs: int) -> dict[str, int]:
    """The same number of local epochs for every device."""
    if epochs < 1:
        raise ValueError("epochs must be at least 1")
    return dict.fromkeys(devices, epochs)


def adaptive_epochs(scores: Mapping[str, float], e_max: int) -> dict[str, int]:
    """E_i = max(1, round(e_max * S_i / S_max)) (seed paper, Eq. 5), S_max over the devices given."""
    if e_max < 1:
        raise ValueError("e_max must be at least 1")
    if not scores:
        return {}
    s_max = max(scores.values())
    if s_max <= 0 or any(s < 0 for s in scores.values()):
        raise ValueError("scores must be non-negative with a positive maximum")
    # Halves round up (2.5 -> 3), the usual reading of the equation, not Python's round-half-to-even.
    return {d: max(1, math.floor(e_max * s / s_max + 0.5)) for d, s in scores.items()}
