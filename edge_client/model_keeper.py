"""Keeps the latest global model in a folder as model.onnx, for `fedspeech listen` on the same device.

Rounds only move forward: an announcement of the round kept or an older one (a replay) is ignored, and
a model that cannot be downloaded leaves the kept one in place, to be tried again RETRY_S later.
"""

import logging
import threading
import time
from pathlib import Path

from fedspeech.edge_client.coordinator_http import CoordinatorClient, Dropped
from fedspeech.protocol import messages, weights
from fedspeech.protocol.files import write_atomically
from fedspeech.protocol.messages import ModelAnnouncement

log = logging.getLogger(__name__)

KEPT_MODEL, KEPT_ANNOUNCEMENT = "model.onnx", "model.json"
RETRY_S = 30.0  # between two attempts at a model that could not be downloaded


class ModelKeeper:
    """Downloads each newer announced ONNX model into model_dir, atomically, and remembers its round."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.kept_round = _kept_round(model_dir)
        self._wanted: ModelAnnouncement | None = None  # newer than the kept one, not downloaded yet
        self._retry_at = 0.0  # time.monotonic() before which the wanted one is not tried again
        self._lock = threading.Lock()

    def offer(self, announcement: ModelAnnouncement) -> None:
        """Take note of a verified announcement (on the MQTT thread) if its round is newer than any seen."""
        if announcement.onnx is None:
            log.info("round %d has no ONNX model to keep", announcement.round)
            return
        with self._lock:
            newest = max(self.kept_round, self._wanted.round if self._wanted else -1)
            if announcement.round == newest:
                log.info("the model of round %d is kept already or on its way", newest)
                return
            if announcement.round < newest:
                log.warning(
                    "ignoring the announcement of round %d: round %d is newer (an old one replayed?)",
                    announcement.round,
                    newest,
                )
                return
            self._wanted, self._retry_at = announcement, 0.0

    def keep(self, http: CoordinatorClient) -> None:
        """Download the newest announced model if there is one to fetch now; a failure is retried later."""
        with self._lock:
            wanted = self._wanted
        if wanted is None or wanted.onnx is None or time.monotonic() < self._retry_at:
            return
        try:
            data = http.fetch(wanted.onnx)
        except (Dropped, weights.WeightsError) as exc:
            log.warning("not keeping the model of round %d: %s; again in %.0f s", wanted.round, exc, RETRY_S)
            self._retry_at = time.monotonic() + RETRY_S
            return
        self.model_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.model_dir / KEPT_MODEL, data)
        write_atomically(self.model_dir / KEPT_ANNOUNCEMENT, messages.encode(wanted))
        with self._lock:
            self.kept_round = wanted.round
            if self._wanted is wanted:
                self._wanted = None
        log.info("kept the global model of round %d in %s", wanted.round, self.model_dir / KEPT_MODEL)


def _kept_round(model_dir: Path) -> int:
    """Round of the model kept in model_dir by an earlier run, -1 if none."""
    try:
        return messages.decode((model_dir / KEPT_ANNOUNCEMENT).read_bytes(), ModelAnnouncement).round
    except (OSError, messages.ProtocolError):
        return -1
