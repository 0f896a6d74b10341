"""Keeps the latest global model in a folder as model.onnx, for `fedspeech listen` on the same device."""

import logging
from pathlib import Path

from fedspeech.edge_client.coordinator_http import CoordinatorClient, Dropped
from fedspeech.protocol import messages, weights
from fedspeech.protocol.files import write_atomically
from fedspeech.protocol.messages import ModelAnnouncement

log = logging.getLogger(__name__)

KEPT_MODEL, KEPT_ANNOUNCEMENT = "model.onnx", "model.json"


class ModelKeeper:
    """Downloads each newer announced ONNX model into model_dir, atomically, and remembers its round."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.kept_round = _kept_round(model_dir)

    def keep(self, announcement: ModelAnnouncement | None, http: CoordinatorClient) -> None:
        """Fetch the announced model if it is newer than the one kept; a failure waits for the next one."""
        if announcement is None or announcement.onnx is None or announcement.round <= self.kept_round:
            return
        try:
            data = http.fetch(announcement.onnx)
        except (Dropped, weights.WeightsError) as exc:
            log.warning("not keeping the model of round %d: %s", announcement.round, exc)
            self.kept_round = announcement.round  # not retried until a newer one is announced
            return
        self.model_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.model_dir / KEPT_MODEL, data)
        write_atomically(self.model_dir / KEPT_ANNOUNCEMENT, messages.encode(announcement))
        self.kept_round = announcement.round
        log.info("kept the global model of round %d in %s", announcement.round, self.model_dir / KEPT_MODEL)


def _kept_round(model_dir: Path) -> int:
    """Round of the model kept in model_dir by an earlier run, -1 if none."""
    try:
        return messages.decode((model_dir / KEPT_ANNOUNCEMENT).read_bytes(), ModelAnnouncement).round
    except (OSError, messages.ProtocolError):
        return -1
