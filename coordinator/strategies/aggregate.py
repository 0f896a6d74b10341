"""Aggregation rules: pure functions from client updates to a new global model."""

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from fedspeech.protocol.weights import Arrays, check_like

NORM_STATISTICS = ("running_mean", "running_var")  # BatchNorm's buffers: averaged, never stepped
MOST_OVER_MEDIAN = 3.0  # the most one device's weight may be, as a multiple of the median device's

R = TypeVar("R")  # a device's result, whatever the rule reads of it


def stepped(name: str, array: np.ndarray) -> bool:
    """Whether an array is a weight that training steps: floating point, and not a BatchNorm statistic."""
    return np.issubdtype(array.dtype, np.floating) and not name.endswith(NORM_STATISTICS)


def without_breakers(
    combine: Callable[[Sequence[R]], Arrays], results: Sequence[R], like: Arrays
) -> tuple[Arrays, list[R]] | None:
    """combine(results) with the results in it; if that raises or is not weights like `like`, the same of
    the results that do not break it on their own. None if nothing can be combined.
    """

    def usable(some: Sequence[R]) -> Arrays | None:
        try:
            combined = combine(some)
            check_like(combined, like)
        except Exception:  # a rule's error on one device's update must not end the round
            return None
        return combined

    combined = usable(results)
    if combined is not None:
        return combined, list(results)
    kept = [r for r in results if usable([r]) is not None]
    combined = usable(kept) if kept else None
    return (combined, kept) if combined is not None else None


def weighted_average(updates: Sequence[Arrays], weights: Sequence[float]) -> Arrays:
    """Average each named array across updates with the given non-negative weights."""
    if not updates or len(updates) != len(weights):
        raise ValueError("need one weight per update and at least one update")
    w = np.asarray(weights, dtype=np.float64)
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    w = w / w.sum()
    return {
        name: sum(wi * u[name].astype(np.float64) for wi, u in zip(w, updates, strict=True)).astype(
            updates[0][name].dtype
        )
        for name in updates[0]
    }


def fedavg(updates: Sequence[Arrays], num_samples: Sequence[int]) -> Arrays:
    """FedAvg (McMahan et al. 2017): the average weighted by each client's number of samples."""
    return weighted_average(updates, [float(n) for n in num_samples])


def fednova(
    current: Arrays, updates: Sequence[Arrays], num_samples: Sequence[int], steps: Sequence[int]
) -> Arrays:
    """FedNova (Wang et al. 2020): changes divided by their local steps, sample-averaged, times mean steps.

    Plain averaging leans towards the devices that ran more steps. Arrays that are not floating point,
    such as counters, are the sample-weighted average.
    """
    if len(steps) != len(updates) or any(t < 1 for t in steps):
        raise ValueError("need one count of at least 1 local step per update")
    plain = fedavg(updates, num_samples)
    p = np.asarray(num_samples, dtype=np.float64) / float(sum(num_samples))
    tau = np.asarray(steps, dtype=np.float64)
    effective = float(p @ tau)
    new = dict(plain)
    for name, a in plain.items():
        if not np.issubdtype(a.dtype, np.floating):
            continue
        base = current[name].astype(np.float64)
        changes = (u[name].astype(np.float64) - base for u in updates)
        direction = sum(pi / ti * d for pi, ti, d in zip(p, tau, changes, strict=True))
        new[name] = (base + effective * direction).astype(a.dtype)
    return new


def rebased(update: Arrays, base: Arrays, current: Arrays) -> Arrays:
    """A stale update's change laid onto the current model: current + (update - base).

    FedBuff (Nguyen et al. 2022) applies a device's change to the global model it arrives at, not to
    the older one it trained from. Counters and normalisation statistics are not changes: they are
    taken as they are.
    """
    check_like(update, base)
    check_like(current, base)
    new = dict(update)
    for name, u in update.items():
        if stepped(name, u):
            change = u.astype(np.float64) - base[name].astype(np.float64)
            new[name] = (current[name].astype(np.float64) + change).astype(u.dtype)
    return new


def staleness_weighted(
    updates: Sequence[Arrays], num_samples: Sequence[int], staleness: Sequence[int]
) -> Arrays:
    """FedBuff's average: each update weighted by its samples / sqrt(1 + the rounds it is stale)."""
    if len(num_samples) != len(staleness) or any(s < 0 for s in staleness):
        raise ValueError("need one staleness of at least 0 per sample count")
    weights = [n / math.sqrt(1 + s) for n, s in zip(num_samples, staleness, strict=True)]
    return weighted_average(updates, weights)


def staleness_fair(
    updates: Sequence[Arrays], num_samples: Sequence[int], mean_staleness: Sequence[float]
) -> Arrays:
    """FedStaleWeight's average: each update weighted by its samples * (1 + its device's mean staleness).

    Ma et al. 2024, "FedStaleWeight: buffered asynchronous federated learning with fair aggregation via
    staleness reweighting": a device whose updates arrive s rounds late counts about once every 1 + s
    rounds, so weighting it up by that much gives every device the same say over time, where
    FedBuff's discount leaves the slow ones' data half learned.
    """
    if len(num_samples) != len(mean_staleness) or any(not s >= 0 for s in mean_staleness):
        raise ValueError("need one mean staleness of at least 0 per sample count")
    weights = [n * (1 + s) for n, s in zip(num_samples, mean_staleness, strict=True)]
    return weighted_average(updates, weights)


def change(current: Arrays, update: Arrays) -> Arrays:
    """The update's change to the model it was laid onto, its stepped arrays only, in float32."""
    return {
        name: (u.astype(np.float64) - current[name].astype(np.float64)).astype(np.float32)
        for name, u in update.items()
        if stepped(name, u)
    }


def cache_calibrated(
    current: Arrays,
    updates: Sequence[Arrays],
    num_samples: Sequence[int],
    previous: Sequence[Arrays | None],
    cache: Sequence[tuple[Arrays, int]],
) -> Arrays:
    """CA2FL's step: current + the mean cached change + the updates' mean change from their previous ones.

    Wang et al. 2024, "Tackling the Data Heterogeneity in Asynchronous Federated Learning with Cached
    Update Calibration". `cache` holds the last counted change of every device that has one, with its
    samples; `previous[i]` is updates[i]'s device's (None before its first). A device that counts once
    every few rounds still moves the model every round by its last change, so the fast devices' data
    do not outweigh its own. Means are by samples, and a device with nothing cached counts as a zero
    change in the cache's mean, as in the paper, so that every round's step is unbiased: when every
    device delivers, it is FedAvg. Arrays that are not stepped (counters, normalisation statistics)
    are the updates' FedAvg.
    """
    if not len(updates) == len(num_samples) == len(previous):
        raise ValueError("need one sample count and one previous change (or None) per update")
    new = fedavg(updates, num_samples)
    n = np.asarray(num_samples, dtype=np.float64)
    held = np.asarray([samples for _, samples in cache], dtype=np.float64)
    if (n <= 0).any() or (held <= 0).any():
        raise ValueError("sample counts must be positive")
    everyone = held.sum() + sum(ni for ni, old in zip(n, previous, strict=True) if old is None)
    for name, mean in new.items():
        if not stepped(name, mean):
            continue
        base = current[name].astype(np.float64)
        step = np.zeros_like(base)
        for w, (cached, _) in zip(held / everyone, cache, strict=True):
            step += w * cached[name]
        for w, update, old in zip(n / n.sum(), updates, previous, strict=True):
            step += w * (update[name].astype(np.float64) - base - (old[name] if old is not None else 0.0))
        new[name] = (base + step).astype(mean.dtype)
    return new


def server_momentum(
    current: Arrays, aggregate: Arrays, velocity: Arrays | None, beta: float
) -> tuple[Arrays, Arrays]:
    """FedAvgM (Hsu et al. 2019): the new global model and velocity, v = beta v + (aggregate - current).

    The velocity starts again when the model's arrays change, as when it grows. Arrays that are not
    floating point, such as counters, and normalisation statistics are taken from the aggregate as they
    are: momentum on BatchNorm's running statistics overshoots them, and a model scored with them
    collapsed onto one class in an EmoDB run.
    """
    if not 0 <= beta < 1:
        raise ValueError("momentum must be in [0, 1)")
    moving = [
        name
        for name, a in aggregate.items()
        if stepped(name, a) and name in current and current[name].shape == a.shape
    ]
    step = {name: aggregate[name].astype(np.float64) - current[name].astype(np.float64) for name in moving}
    if (
        velocity is not None
        and velocity.keys() == step.keys()
        and all(velocity[name].shape == d.shape for name, d in step.items())
    ):
        step = {name: d + beta * velocity[name] for name, d in step.items()}
    new = dict(aggregate)
    for name, d in step.items():
        new[name] = (current[name].astype(np.float64) + d).astype(aggregate[name].dtype)
    return new, step


def hardware_weighted(
    updates: Sequence[Arrays], num_samples: Sequence[int], scores: Sequence[float]
) -> Arrays:
    """Hardware-aware aggregation: the average weighted by n_i * S_i, samples times score, each weight at
    most MOST_OVER_MEDIAN times the median weight.

    A score comes from the profile a device reports of itself: one that claims the best hardware of the
    fleet may outweigh the median device by the same multiple as its sample count may, no more.
    """
    if len(num_samples) != len(scores):
        raise ValueError("need one hardware score per sample count")
    weights = [float(n) * float(s) for n, s in zip(num_samples, scores, strict=True)]
    most = MOST_OVER_MEDIAN * float(np.median(weights)) if weights else 0.0
    return weighted_average(updates, [min(w, most) for w in weights])


def coordinate_median(updates: Sequence[Arrays]) -> Arrays:
    """The median of each weight across the updates (Yin et al. 2018); robust to a minority of outliers."""
    if not updates:
        raise ValueError("need at least one update")
    return {
        name: np.median(np.stack([u[name].astype(np.float64) for u in updates]), axis=0).astype(
            updates[0][name].dtype
        )
        for name in updates[0]
    }


def trimmed_mean(updates: Sequence[Arrays], trim: float) -> Arrays:
    """The mean of each weight across the updates without its floor(trim * n) largest and smallest values."""
    # Coordinate-wise trimmed mean, Yin et al. 2018, "Byzantine-robust distributed learning".
    if not 0 <= trim < 0.5:
        raise ValueError("trim must be at least 0 and below 0.5")
    if not updates:  # with trim below 0.5 at least one value per weight remains of any other number
        raise ValueError("need at least one update")
    n = len(updates)
    cut = math.floor(trim * n + 1e-9)  # 0.29 * 100 is 28.999999999999996, and cuts 29
    return {
        name: np.sort(np.stack([u[name].astype(np.float64) for u in updates]), axis=0)[cut : n - cut]
        .mean(axis=0)
        .astype(updates[0][name].dtype)
        for name in updates[0]
    }


def _delta(current: Arrays, update: Arrays) -> Arrays:
    return {name: update[name].astype(np.float64) - current[name].astype(np.float64) for name in current}


def update_norms(current: Arrays, updates: Sequence[Arrays]) -> list[float]:
    """The L2 norm of each update's difference from the current model, all its arrays as one vector."""
    return [math.sqrt(sum(float(np.sum(d**2)) for d in _delta(current, u).values())) for u in updates]


def median_norm(current: Arrays, updates: Sequence[Arrays]) -> float:
    """The median of the update norms: a clipping bound that follows the honest majority's scale."""
    if not updates:
        raise ValueError("need at least one update")
    return float(np.median(update_norms(current, updates)))


def clip_updates(current: Arrays, updates: Sequence[Arrays], max_norm: float) -> list[Arrays]:
    """Each update with its difference from the current model scaled down to L2 norm max_norm at most."""
    if not max_norm >= 0:  # also refuses NaN
        raise ValueError("max_norm must not be negative")
    clipped = []
    for update, norm in zip(updates, update_norms(current, updates), strict=True):
        if norm <= max_norm:
            clipped.append(update)  # never scaled up, and passed on untouched
            continue
        scale = max_norm / norm
        delta = _delta(current, update)
        clipped.append(
            {name: (current[name] + scale * d).astype(update[name].dtype) for name, d in delta.items()}
        )
    return clipped


def stepped_norms(current: Arrays, updates: Sequence[Arrays]) -> list[float]:
    """The L2 norm of each update's change from current in the weights training steps."""
    names = [name for name, array in current.items() if stepped(name, array)]
    return [
        math.sqrt(sum(float(np.sum((u[name].astype(np.float64) - current[name]) ** 2)) for name in names))
        for u in updates
    ]


def quality_weights(
    scores: Sequence[float], temperature: float, num_samples: Sequence[int] | None = None
) -> list[float]:
    """Aggregation weights softmax(score / temperature), times each update's samples if given; sum 1."""
    # FedVMR's c-validation: a local model that scores better on the validation set counts for more.
    if not scores or not temperature > 0:
        raise ValueError("need at least one score and a positive temperature")
    logits = np.asarray(scores, dtype=np.float64) / temperature
    if not np.isfinite(logits).all():
        raise ValueError("scores must be finite")
    weights = np.exp(logits - logits.max())
    if num_samples is not None:
        if len(num_samples) != len(scores):
            raise ValueError("need one sample count per score")
        weights = weights * np.asarray(num_samples, dtype=np.float64)
    return (weights / weights.sum()).tolist()


def population_distribution(counts: Sequence[Sequence[int]], num_samples: Sequence[int]) -> np.ndarray:
    """p = sum_k n_k / n * q_k, each device's q_k its predicted class counts with +1 smoothing."""
    # FedVMR's population class distribution; the +1 keeps every class possible, as the paper does.
    if not counts or len(counts) != len(num_samples):
        raise ValueError("need one sample count per device's class counts, and at least one device")
    c = np.asarray(counts, dtype=np.float64) + 1.0
    if c.ndim != 2 or (c < 1).any():
        raise ValueError("class counts must be equally long lists of non-negative counts")
    q = c / c.sum(axis=1, keepdims=True)
    n = np.asarray(num_samples, dtype=np.float64)
    if (n <= 0).any():
        raise ValueError("sample counts must be positive")
    return (n / n.sum()) @ q
