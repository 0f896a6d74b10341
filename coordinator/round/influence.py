"""How much one device can move the global model: the samples its update counts for, and its change's norm.

Pure functions. A device's weight comes from what the coordinator has seen of it through authenticated
channels (its registration with its token, its upload's own metadata), never from an MQTT status that
anyone on the broker can publish; and it may grow only a little from one round to the next and stay
within a small multiple of the fleet's median. Each update's change to the global model is bounded in
L2 norm before any strategy combines it (Sun et al. 2019, "Can You Really Backdoor Federated
Learning?"): a device that boosts its change to replace the model is brought back to an ordinary step.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from fedspeech.coordinator.config import NormBound
from fedspeech.coordinator.strategies import Result
from fedspeech.coordinator.strategies.aggregate import clip_updates, update_norms
from fedspeech.protocol.weights import Arrays


@dataclass(frozen=True)
class SampleLimits:
    """What bounds the samples an update counts for, beyond its device's registration."""

    growth: float  # the fraction by which a device's count may grow from the last one that counted
    over_median: float  # the most a device counts for, as a multiple of the fleet's median count
    most: int  # the operator's cap on any update


def fleet_median(registered: Mapping[str, int], counted: Mapping[str, int]) -> float | None:
    """The median of the registered devices' standing counts: the last that counted, else the registered.

    Devices with no samples are left out; None when no device has any.
    """
    standing = [counted.get(device, samples) for device, samples in registered.items()]
    positive = [n for n in standing if n > 0]
    return float(np.median(positive)) if positive else None


def sample_ceiling(registered: int, last: int | None, median: float | None, limits: SampleLimits) -> int:
    """The most samples a device's next update counts for, whatever it claims.

    registered: the count it registered over HTTP; last: the count its latest aggregated update counted
    for (None before its first); median: the fleet's (fleet_median). A compromised device that claims
    100,000 samples counts for at most over_median times the fleet's median, reached no faster than
    growth a round.
    """
    most = min(registered, limits.most)
    if last is not None:
        most = min(most, math.ceil(last * (1 + limits.growth)))
    if median is not None:
        most = min(most, math.floor(limits.over_median * median))
    return max(most, 0)


def norm_limit(bound: NormBound, factor: float, norms: Sequence[float]) -> float | None:
    """The longest change an update may make this round: fixed, factor x the median of the finite norms,
    or None for no bound (off, or no finite norm to take the median of).
    """
    if isinstance(bound, float):
        return bound
    finite = [n for n in norms if math.isfinite(n)]
    return factor * float(np.median(finite)) if finite and bound == "median" else None


@dataclass(frozen=True)
class Shortened:
    """An update whose change was longer than the round's bound: whose, how long, and the bound."""

    device_id: str
    norm: float
    bound: float


def norm_bounded(
    current: Arrays, results: Sequence[Result], bound: NormBound, factor: float
) -> tuple[list[Result], list[Shortened]]:
    """The results, each change from current scaled down to the round's bound (norm_limit); those shortened.

    A change that is not finite is left as it is, for the aggregation to drop.
    """
    norms = update_norms(current, [r.arrays for r in results])
    limit = norm_limit(bound, factor, norms)
    if limit is None:
        return list(results), []
    clipped = clip_updates(current, [r.arrays for r in results], limit)
    bounded, shortened = [], []
    for result, arrays, norm in zip(results, clipped, norms, strict=True):
        if norm > limit and math.isfinite(norm):
            bounded.append(replace(result, arrays=arrays))
            shortened.append(Shortened(result.device_id, norm, limit))
        else:
            bounded.append(result)
    return bounded, shortened
