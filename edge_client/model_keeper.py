"""Keeps the latest global model in a folder as model.onnx, for `fedspeech listen` on the same device.

Rounds only move forward (runtime.announcements, the rule `fedspeech listen`'s follower keeps too): an
announcement of the round kept or an older one (a replay), or below the floor kept across restarts, is
ignored, and a model that cannot be downloaded leaves the kept one in place, to be tried again RETRY_S
later. Before it downloads a model announced on the broker (whose retained message anyone on an open broker
may have replaced), and after each reconnection, the keeper asks the coordinator for its latest
announcement over HTTP(S), signed by the pinned key. A device that keeps its own normalisation layers
(FedBN) or statistics (SiloBN) keeps the global model with those laid over it: its personalised model.
"""

import logging
import tempfile
import threading
import time
from pathlib import Path

from fedspeech.edge_client.coordinator_http import CoordinatorClient
from fedspeech.edge_client.local_norm import LocalNorm
from fedspeech.protocol import messages, weights
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.files import write_atomically
from fedspeech.protocol.messages import ModelAnnouncement
from fedspeech.protocol.topics import Topics
from fedspeech.runtime.announcements import Floor, worth_fetching
from fedspeech.runtime.http_requests import Dropped

log = logging.getLogger(__name__)

KEPT_MODEL, KEPT_ANNOUNCEMENT = "model.onnx", "model.json"
RETRY_S = 30.0  # between two attempts at a model that could not be downloaded


class ModelKeeper:
    """Downloads each newer announced ONNX model into model_dir, atomically, and remembers its round.

    topic: where the coordinator announces (its announcements are signed for it); floor: the newest round
    seen announced, kept across restarts (None: in memory only). With local_norm, the device's kept
    normalisation arrays (if any) replace the global model's.
    """

    def __init__(
        self,
        model_dir: Path,
        local_norm: LocalNorm | None = None,
        *,
        topic: str = Topics().model,
        floor: Floor | None = None,
    ) -> None:
        self.model_dir, self.topic, self.local_norm = model_dir, topic, local_norm
        self.floor = floor or Floor(None, "", topic)
        self.kept_round = _kept_round(model_dir)
        self._wanted: ModelAnnouncement | None = None  # newer than the kept one, not downloaded yet
        self._retry_at = 0.0  # time.monotonic() before which the wanted one is not tried again
        self._ask = True  # ask the coordinator for its latest before downloading an announced model
        self._lock = threading.Lock()

    def recheck(self) -> None:
        """Ask the coordinator for its latest announcement again before the next download (on a reconnection:
        the retained one may have been replaced meanwhile).
        """
        self._ask = True

    def offer(self, announcement: ModelAnnouncement) -> None:
        """Take note of a verified announcement (on the MQTT thread) if its round is newer than any seen."""
        with self._lock:
            if not worth_fetching(announcement, self.kept_round, self._wanted, self.floor):
                return
            self._wanted, self._retry_at = announcement, 0.0

    def keep(self, http: CoordinatorClient) -> None:
        """Download the newest announced model if there is one to fetch now; a failure is retried later.

        The coordinator's latest announcement is asked for first when due (recheck); one that cannot be
        had leaves the announcements from the broker to go by.
        """
        if self._ask:
            self._ask = False
            self._ask_latest(http)
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
        kind = "personalised" if self._write_personalised(data, wanted.round) else "global"
        if kind == "global":
            write_atomically(self.model_dir / KEPT_MODEL, data)
        write_atomically(self.model_dir / KEPT_ANNOUNCEMENT, messages.encode(wanted))
        with self._lock:
            self.kept_round = wanted.round
            if self._wanted is wanted:
                self._wanted = None
        log.info("kept the %s model of round %d in %s", kind, wanted.round, self.model_dir / KEPT_MODEL)

    def _ask_latest(self, http: CoordinatorClient) -> None:
        """Offer the coordinator's latest announcement, asked over HTTP(S); log why not if it cannot be."""
        try:
            latest = http.latest_announcement(self.topic)
        except (Dropped, ProtocolError) as exc:
            log.warning("cannot check the coordinator's latest model: %s", exc)
            return
        if latest is not None:
            self.offer(latest)

    def _write_personalised(self, onnx_file: bytes, round: int) -> bool:
        """Write the global ONNX with the kept normalisation arrays laid over it; False if there are none.

        A model they do not fit (another architecture) is not written, with a warning.
        """
        kept = self.local_norm.load() if self.local_norm is not None else None
        if not kept:
            return False
        from fedspeech.export.onnx_weights import update_onnx_weights

        with tempfile.TemporaryDirectory() as folder:
            template = Path(folder) / "global.onnx"
            template.write_bytes(onnx_file)
            try:
                update_onnx_weights(template, kept, self.model_dir / KEPT_MODEL)
            # not only ValueError (layers that do not fit): a file that does not parse raises protobuf's own
            except Exception as exc:
                log.warning("keeping the global model of round %d, not a personalised one: %s", round, exc)
                return False
        return True


def _kept_round(model_dir: Path) -> int:
    """Round of the model kept in model_dir by an earlier run, -1 if none."""
    try:
        return messages.decode((model_dir / KEPT_ANNOUNCEMENT).read_bytes(), ModelAnnouncement).round
    except (OSError, ProtocolError):
        return -1
