"""What an update says of itself in its metadata, read within bounds: a device could write anything there."""

import json
import math
import re
from collections.abc import Mapping

from fedspeech.protocol import bounds

_COUNT = re.compile(r"^[0-9]{1,18}$")  # an update's num_samples: a plain decimal count, parsed cheaply
_MAX_NUMBER_CHARS = 64  # an update's train_loss or train_seconds
_MAX_COUNTS_CHARS = 64 * 20  # an update's predicted_counts: a JSON list of up to 64 counts


def optional_number(meta: Mapping[str, str], key: str) -> float | None:
    """A number from an update's metadata, None if absent or not finite; ValueError if it is not a number."""
    text = meta.get(key)
    if text is None:
        return None
    if len(text) > _MAX_NUMBER_CHARS:
        raise ValueError(f"{key} is not a number")
    value = float(text)
    return value if math.isfinite(value) else None


def claimed_samples(meta: Mapping[str, str]) -> int:
    """An update's num_samples; ValueError unless it is a whole number of at most 18 digits."""
    text = meta.get("num_samples")
    if text is None or not _COUNT.match(text):
        raise ValueError("num_samples must be a whole number of at most 18 digits")
    return int(text)


def local_steps(meta: Mapping[str, str], most: int) -> int | None:
    """An update's optimiser steps, None if absent, within [1, most]; ValueError unless a whole number."""
    text = meta.get("local_steps")
    if text is None:
        return None
    if not _COUNT.match(text):
        raise ValueError("local_steps must be a whole number of at most 18 digits")
    return min(max(int(text), 1), most)


def predicted_counts(meta: Mapping[str, str], num_classes: int) -> tuple[int, ...] | None:
    """An update's predicted class counts, None if absent; ValueError unless num_classes bounded counts."""
    text = meta.get("predicted_counts")
    if text is None:
        return None
    try:
        counts = json.loads(text) if len(text) <= _MAX_COUNTS_CHARS else None
    except ValueError:  # not JSON, or an integer of thousands of digits
        counts = None
    if (
        not isinstance(counts, list)
        or len(counts) != num_classes
        or not all(type(c) is int and 0 <= c <= bounds.MAX_COUNT for c in counts)
    ):
        raise ValueError(f"predicted_counts must be a list of {num_classes} counts")
    return tuple(counts)
