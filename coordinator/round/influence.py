"""How much one device can move the global model: the samples its update counts for, and its change's norm.

Pure functions. A device's weight comes from what the coordinator has seen of it through authenticated
channels (its registration with its token, its upload's own metadata), never from an MQTT status that
anyone on the broker can publish; and it may grow only a little from one round to the next and stay
within a small multiple of the fleet's median. Each update's change to the global model is bounded in
L2 norm before any strategy combines it (Sun et al. 2019, "Can You Really Backdoor Federated
Learning?"): a device that boosts its change to replace the model is brought back to an ordinary step.
A change that points away from the round's other changes is left out, and one nearly at right angles
to them counts for less (checked_directions): bounded in size alone, one reversed change of ordinary
norm still undoes a device's share of every round.
"""

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from fedspeech.coordinator.config import NormBound, RoundConfig
from fedspeech.coordinator.strategies import Result
from fedspeech.coordinator.strategies.aggregate import clip_updates, stepped, update_norms
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)


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


MIN_TO_TELL = 3  # changes a round needs for each to be compared with at least two others' directions
# How far a device's standing, this round's cosine in it, must point away for its change to be left out.
# Once the model has learned, honest changes point nearly at right angles to each other, a little away
# now and then: on a clean FSDD fleet of four over 20 rounds, single cosines down to -0.049 and standings
# never below -0.018 (though once, with a compromised fifth left out, one fell below -0.03); a reversed
# change's cosine was -0.096 in its first round and below -0.1 after.
MIN_AWAY = 0.03


@dataclass(frozen=True)
class Direction:
    """How an update's change points against the others' (cosines_with_the_others): left out, or counted
    for fewer samples.
    """

    device_id: str
    cosine: float
    samples: int  # what it counts for now: 0 if left out


def cosines_with_the_others(changes: Sequence[np.ndarray]) -> list[float]:
    """Each change's cosine with the sum of the others' directions, each of length 1 (0 where there is none).

    Every device has one vote of the same length, so that two devices with long changes cannot turn the
    others' direction their way.
    """
    lengths = [float(np.linalg.norm(change)) for change in changes]
    units = [
        change / length if length > 0 else change for change, length in zip(changes, lengths, strict=True)
    ]
    total = np.sum(units, axis=0)
    cosines = []
    for unit in units:
        others = total - unit
        size = float(np.linalg.norm(unit) * np.linalg.norm(others))
        cosines.append(float(unit @ others) / size if size > 0 else 0.0)
    return cosines


STANDING_LATEST = 0.5  # the share of a round's cosine in a device's standing; the rounds before, the rest


@dataclass
class Standings:
    """Each device's standing: its changes' cosines with the others' averaged over its rounds, the latest
    counting for STANDING_LATEST. Honest devices' changes point a little away from the others' now and
    then once the model has learned (measured: two of six FSDD speakers at -0.047 and -0.038 in round 11
    of the demo); a compromised device's do round after round.
    """

    of: dict[str, float] = field(default_factory=dict)

    def with_cosine(self, device: str, cosine: float) -> float:
        """The device's standing were this round's cosine in it."""
        return (1 - STANDING_LATEST) * self.of.get(device, cosine) + STANDING_LATEST * cosine

    def after(self, cosines: Mapping[str, float]) -> dict[str, float]:
        """The devices' standings with this round's cosines in them, kept."""
        self.of.update({device: self.with_cosine(device, cosine) for device, cosine in cosines.items()})
        return {device: self.of[device] for device in cosines}


def checked_directions(
    current: Arrays, results: Sequence[Result], standings: Standings | None = None
) -> tuple[list[Result], list[Direction]]:
    """The results without those whose change points away from the others', and those that point their way
    less than half as much as the median does counting for no more samples than the median; what was done
    to whom.

    Devices that train honestly from one model share a direction however different their data: measured
    on FSDD, each speaker's change from a random start had cosine 0.03 to 0.06 with another's, and a
    reversed one as much below 0; the direction firms up as the model learns. The change that points
    furthest away (cosine <= 0) from a device whose standing (Standings, this round's cosine in it)
    points away by MIN_AWAY or more is left out and the others compared again, until no such change is
    left, fewer than MIN_TO_TELL remain or a strict minority has been left out; each standing then takes
    the device's cosine in the last comparison it was in (with the others that counted). Where every
    change points away, only one from a device whose standing already did before the round is left out. Of
    those kept, one whose cosine is below half the median counts for no more samples than the median
    kept device: a change nearly at right angles to the others' adds to the model mostly what no other
    device found, and a large count must not make it the round's. (Weighing such changes down in
    proportion to their cosine cost honest devices in late rounds, when the fleet's changes are nearly
    orthogonal.) With fewer than MIN_TO_TELL changes the round cannot tell and nothing is done. Only the
    weights training steps are compared; a change that is not finite is left for the aggregation to
    drop, and one that changes nothing has no direction to judge.
    """
    names = [name for name, array in current.items() if stepped(name, array)]
    flat = [
        np.concatenate([(r.arrays[name].astype(np.float64) - current[name]).ravel() for name in names])
        for r in results
    ]
    remaining = [i for i, change in enumerate(flat) if np.isfinite(change).all() and change.any()]
    most_left_out = (len(remaining) - 1) // 2
    done: dict[int, Direction] = {}
    cosines: list[float] = []
    standings = standings if standings is not None else Standings()
    last: dict[str, float] = {}  # each device's cosine in the last comparison of the round it was in
    while len(remaining) >= MIN_TO_TELL and names:
        cosines = cosines_with_the_others([flat[i] for i in remaining])
        ids = [results[i].device_id for i in remaining]
        last.update(zip(ids, cosines, strict=True))
        # of the changes that point away from the others', those from devices whose standing does too;
        # where every change points away (two compromised devices that agree drag the others' down), only
        # those of devices whose standing did before this round
        tell = max(cosines) > 0
        away = [
            (c, n)
            for n, (d, c) in enumerate(zip(ids, cosines, strict=True))
            if c <= 0
            and standings.with_cosine(d, c) <= -MIN_AWAY
            and (tell or standings.of.get(d, 0.0) <= -MIN_AWAY)
        ]
        if not away or len(done) == most_left_out:
            break
        worst = min(away)[1]
        done[remaining[worst]] = Direction(results[remaining[worst]].device_id, cosines[worst], 0)
        del remaining[worst]
    standings.after(last)
    if len(cosines) == len(remaining) and max(cosines, default=0) > 0:
        half_median = float(np.median(cosines)) / 2
        median_samples = int(np.median([results[i].num_samples for i in remaining]))
        for i, cosine in zip(remaining, cosines, strict=True):
            if cosine < half_median and results[i].num_samples > median_samples:
                done[i] = Direction(results[i].device_id, cosine, median_samples)
    checked = [
        r if i not in done else replace(r, num_samples=done[i].samples)
        for i, r in enumerate(results)
        if i not in done or done[i].samples > 0
    ]
    return checked, [done[i] for i in sorted(done)]


def direction_unchecked(config: RoundConfig) -> str | None:
    """Why rounds keep a change that points away from the others', in words; None if they leave it out."""
    if not config.direction_check:
        return "updates are not checked against each other's direction (--no-direction-check)"
    if config.secure_aggregation:
        return (
            "under secure aggregation the coordinator never sees one device's change: it cannot leave out "
            "one that points away from the others', and each device bounds its own change's norm (a sum "
            "longer than bounded changes can give is refused, and its round run again with one device "
            "left out in turn until the one that did not is found)"
        )
    if config.privacy is not None:
        return (
            "under differential privacy a change is not checked against the others': one device's update "
            "would then decide whether another's counts, which the privacy accounting does not allow"
        )
    return None


def too_few_to_tell(config: RoundConfig) -> str | None:
    """Why some rounds may not check directions, in words: a minimum of devices below MIN_TO_TELL."""
    if config.min_devices >= MIN_TO_TELL or direction_unchecked(config) is not None:
        return None
    return (
        f"a round of fewer than {MIN_TO_TELL} updates cannot tell a change that points away from the "
        f"others' (--min-devices {config.min_devices} lets a round run with {config.min_devices})"
    )


def say_where_directions_go_unchecked(config: RoundConfig) -> None:
    """Log at start where rounds cannot check directions: a warning where none will, else information
    where some may have too few updates to.
    """
    if (unchecked := direction_unchecked(config)) is not None:
        log.warning("%s", unchecked)
    elif (few := too_few_to_tell(config)) is not None:
        log.info("%s", few)


def bounded(
    round: int, current: Arrays, results: Sequence[Result], config: RoundConfig, standings: Standings
) -> list[Result]:
    """The results with each change from current bounded in norm (norm_bounded), then without those that
    point away from the others' (checked_directions, the devices' standings updated) where the rounds may
    check directions; each logged.
    """
    kept, shortened = norm_bounded(current, results, config.norm_bound, config.norm_bound_factor)
    for s in shortened:
        log.info("round %d: %s's change of norm %.4g bounded to %.4g", round, s.device_id, s.norm, s.bound)
    if direction_unchecked(config) is None:
        kept, directions = checked_directions(current, kept, standings)
        for d in directions:
            done = f"counted for {d.samples} samples" if d.samples else "left out"
            log.warning(
                "round %d: %s's change points %s the other devices' (cosine %.3g with their directions): %s",
                round, d.device_id, "away from" if d.cosine <= 0 else "little along", d.cosine, done,
            )  # fmt: skip
    return kept
