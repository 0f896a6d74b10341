"""Scheduling: how many local epochs each selected device trains in a round, and how deep the model is."""

import math
from collections.abc import Iterable, Mapping


def fixed_epochs(devices: Iterable[str], epochs: int) -> dict[str, int]:
    """The same number of local epochs for every device."""
    if epochs < 1:
        raise ValueError("epochs must be at least 1")
    return dict.fromkeys(devices, epochs)


def adaptive_epochs(scores: Mapping[str, float], e_max: int) -> dict[str, int]:
    """E_i = max(1, round(e_max * S_i / S_max)) (Hardware-Aware FL for SER, Eq. 5), S_max over those given."""
    if e_max < 1:
        raise ValueError("e_max must be at least 1")
    if not scores:
        return {}
    s_max = max(scores.values())
    if s_max <= 0 or any(s < 0 for s in scores.values()):
        raise ValueError("scores must be non-negative with a positive maximum")
    # Halves round up (2.5 -> 3), the usual reading of the equation, not Python's round-half-to-even.
    return {d: max(1, math.floor(e_max * s / s_max + 0.5)) for d, s in scores.items()}


def depth_for_round(round: int, rounds: int, max_depth: int, schedule: str, stages: int) -> int:
    """Encoder depth l_t trained in a round (1-based) of `rounds` (the dynamic transformer's schedule).

    schedule "constant": max_depth from the start. "linear": `stages` equal spans of rounds, the depth
    growing by max_depth / stages blocks at each (rounded up). Otherwise a comma-separated list of depths,
    one per equal span, e.g. "1,2,4".
    """
    if not 1 <= round <= rounds or max_depth < 1:
        raise ValueError("need 1 <= round <= rounds and max_depth >= 1")
    if schedule == "constant":
        return max_depth
    if schedule == "linear":
        if not 1 <= stages <= max_depth:
            raise ValueError(f"stages must be between 1 and the depth {max_depth}")
        depths = [math.ceil(max_depth * (s + 1) / stages) for s in range(stages)]
    else:
        try:
            depths = [int(part) for part in schedule.split(",")]
        except ValueError:
            raise ValueError(f"depth schedule {schedule!r}: expected constant, linear or depths") from None
        if any(not 1 <= d <= max_depth for d in depths) or depths != sorted(depths):
            raise ValueError(f"depths must grow, each between 1 and {max_depth}: {schedule!r}")
    # the rounds split into len(depths) spans as equal as they can be, earlier spans no longer
    return depths[(round - 1) * len(depths) // rounds]


def learning_rate_for_round(round: int, rounds: int, learning_rate: float, final_fraction: float) -> float:
    """The devices' learning rate in a round (1-based): cosine from learning_rate to final_fraction of it.

    final_fraction 1 keeps it constant. Rounds past `rounds` (a run extended) keep the final rate.
    """
    if rounds < 1 or round < 1 or not 0 < final_fraction <= 1:
        raise ValueError("need round >= 1, rounds >= 1 and 0 < final_fraction <= 1")
    progress = 0.0 if rounds == 1 else min(1.0, (round - 1) / (rounds - 1))
    return learning_rate * (final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))
