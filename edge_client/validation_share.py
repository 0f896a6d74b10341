"""Training clips shared with the coordinator for quality-weighted aggregation, on the operator's opt-in.

Raw audio leaves the device here and nowhere else, and only with `fedspeech client --share-validation N`.
"""

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from fedspeech.edge_client.coordinator_http import CoordinatorClient
from fedspeech.edge_client.local_data import Split
from fedspeech.protocol import routes, weights
from fedspeech.runtime.http_requests import Dropped

log = logging.getLogger(__name__)

UPLOAD_SECONDS = 120.0


def pick_clips(labels: np.ndarray, count: int) -> np.ndarray:
    """The indices of count clips taken in turn from each label (the first clips of each), sorted."""
    by_label = [np.flatnonzero(labels == label).tolist() for label in np.unique(labels)]
    picked: list[int] = []
    while len(picked) < count and any(by_label):
        for indices in by_label:
            if indices and len(picked) < count:
                picked.append(indices.pop(0))
    return np.array(sorted(picked), dtype=np.int64)


def share_validation_clips(
    http: CoordinatorClient,
    train: Split,
    count: int,
    label_names: Sequence[str],
    register: Callable[[], bool],
) -> None:
    """Upload count training clips (float32 audio and labels) to the coordinator, saying so in the log."""
    chosen = pick_clips(train.labels[: train.clips], count)  # its own clips, never synthetic takes
    if len(chosen) == 0:
        log.info("no training clips to share for validation yet")
        return
    classes, counts = np.unique(train.labels[chosen], return_counts=True)
    per_label = {label_names[i]: int(n) for i, n in zip(classes, counts, strict=True)}
    log.warning(
        "sharing %d training clips with the coordinator for validation (--share-validation): their audio "
        "leaves this device; per label %s",
        len(chosen),
        per_label,
    )
    body = weights.encode({"waveforms": train.waveforms[chosen], "labels": train.labels[chosen]})
    try:
        http.upload(
            routes.VALIDATION, body, "application/octet-stream", time.time() + UPLOAD_SECONDS, register
        )
    except Dropped as exc:
        log.warning("the validation clips were not shared: %s", exc)
