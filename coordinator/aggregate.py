"""Aggregation rules: pure functions from client updates to a new global model."""

from collections.abc import Sequence

import numpy as np

from fedspeech.protocol.weights import Arrays


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


def hardware_weighted(
    updates: Sequence[Arrays], num_samples: Sequence[int], scores: Sequence[float]
) -> Arrays:
    """Hardware-aware aggregation: the average weighted by n_i * S_i, samples times score."""
    if len(num_samples) != len(scores):
        raise ValueError("need one hardware score per sample count")
    return weighted_average(updates, [float(n) * float(s) for n, s in zip(num_samples, scores, strict=True)])


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
