"""Device selection: hardware scores S_i, random and hardware-aware top-K choice, deadline-miss penalties."""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from fedspeech.protocol.messages import Profile

# Lowest score before the penalty: local epochs divide by S_max and aggregation multiplies by S_i, so no
# device may score exactly 0. Applied as an affine map (floor + (1 - floor) * s) rather than max(floor, s)
# so that the order of devices is kept even at the bottom.
SCORE_FLOOR = 0.05
# Lowest penalty factor: repeated misses drive a device down fast but never to exactly 0 (nor to an
# underflowing denormal), so it can still be explored and come back.
MIN_PENALTY = 0.01


@dataclass(frozen=True)
class ScoreWeights:
    """Weights of the normalised metrics in the hardware score S_i (Hardware-Aware FL for SER, Eq. 3)."""

    # The paper gives no numbers. The round lasts as long as its slowest selected device trains, so the
    # measured seconds per sample of the real model (T) weighs most; the benchmark throughput (CPU)
    # predicts T before it has been measured and after the model changes; the round trip (L) matters less
    # because weights travel once per round over HTTP; RAM hardly changes speed once the model fits.
    cpu: float = 0.3
    ram: float = 0.1
    speed: float = 0.4
    latency: float = 0.2

    def __post_init__(self) -> None:
        values = [getattr(self, f.name) for f in fields(self)]
        if any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
            raise ValueError("score weights must be finite, non-negative and not all zero")


DEFAULT_WEIGHTS = ScoreWeights()


def _measured(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _metrics(profile: Profile) -> dict[str, float | None]:
    """The four metrics of a profile, each oriented so that higher is better; None when unmeasured."""
    cpu = _measured(profile.cpu_gflops)
    ram = _measured(profile.ram_available_mb)
    seconds = _measured(profile.seconds_per_sample)
    rtt = _measured(profile.rtt_ms)
    return {
        "cpu": cpu,
        "ram": ram,
        "speed": 1.0 / seconds if seconds is not None and seconds > 0 else None,
        "latency": -rtt if rtt is not None else None,  # negated so that min-max gives 1 to the lowest
    }


def _normalise(values: Mapping[str, float | None]) -> dict[str, float]:
    """Min-max normalise across the pool; equal values give 1, unmeasured ones the pool's median."""
    known = {d: v for d, v in values.items() if v is not None}
    if not known:
        return dict.fromkeys(values, 1.0)
    lo, hi = min(known.values()), max(known.values())
    scaled = {d: 1.0 if hi == lo else (v - lo) / (hi - lo) for d, v in known.items()}
    median = float(np.median(list(scaled.values())))
    return {d: scaled.get(d, median) for d in values}


def hardware_scores(
    profiles: Mapping[str, Profile],
    weights: ScoreWeights = DEFAULT_WEIGHTS,
    penalties: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Hardware score S_i in (0, 1] of each device, normalised across the given pool, times its penalty."""
    per_device = {d: _metrics(p) for d, p in profiles.items()}
    total = sum(getattr(weights, f.name) for f in fields(weights))
    linear = dict.fromkeys(profiles, 0.0)
    for f in fields(weights):
        normalised = _normalise({d: m[f.name] for d, m in per_device.items()})
        for d in profiles:
            linear[d] += getattr(weights, f.name) * normalised[d]
    penalties = penalties or {}
    if any(p < 0 for p in penalties.values()):
        raise ValueError("penalty factors must not be negative")
    return {
        d: (SCORE_FLOOR + (1.0 - SCORE_FLOOR) * linear[d] / total) * penalties.get(d, 1.0) for d in profiles
    }


def select_all(devices: Sequence[str]) -> list[str]:
    """Every device, in id order."""
    return sorted(set(devices))


def select_random(devices: Sequence[str], k: int, rng: np.random.Generator) -> list[str]:
    """k devices drawn uniformly without replacement (all of them if k exceeds the pool), in id order."""
    if k < 0:
        raise ValueError("k must not be negative")
    pool = sorted(set(devices))
    chosen = rng.choice(len(pool), size=min(k, len(pool)), replace=False)
    return sorted(pool[i] for i in chosen)


def over_selected(k: int, over_select: float, pool: int) -> int:
    """How many devices to ask so that k results arrive: ceil(over_select * k), at most the pool."""
    # Rounded first so that float noise (1.3 * 10 = 13.000000000000002) does not add a device.
    return min(pool, math.ceil(round(over_select * k, 9)))


def select_top_k(
    scores: Mapping[str, float],
    k: int,
    *,
    over_select: float = 1.3,
    explore: float = 0.1,
    rng: np.random.Generator,
) -> list[str]:
    """The ceil(over_select * k) best-scored devices; with probability explore a slot goes to a random one."""
    if k < 0 or over_select < 1 or not 0 <= explore <= 1:
        raise ValueError("need k >= 0, over_select >= 1 and 0 <= explore <= 1")
    remaining = sorted(scores, key=lambda d: (-scores[d], d))  # best first, ties by device id
    chosen = []
    for _ in range(over_selected(k, over_select, len(remaining))):
        # One draw per slot whatever explore is, so the rng stream (and every later draw) does not
        # depend on the exploration rate.
        explored = rng.random() < explore
        chosen.append(remaining.pop(int(rng.integers(len(remaining))) if explored else 0))
    return chosen


def update_penalties(
    penalties: Mapping[str, float],
    selected: Iterable[str],
    on_time: Iterable[str],
    *,
    factor: float = 0.5,
    recovery: float = 0.1,
) -> dict[str, float]:
    """New penalty factors: a selected device that missed is multiplied by factor, one on time recovers."""
    if not 0 < factor <= 1 or recovery < 0:
        raise ValueError("need 0 < factor <= 1 and recovery >= 0")
    delivered = set(on_time)
    updated = dict(penalties)
    for device in set(selected):
        current = penalties.get(device, 1.0)
        if device in delivered:
            updated[device] = min(1.0, current + recovery)
        else:
            updated[device] = max(MIN_PENALTY, current * factor)
    return updated
