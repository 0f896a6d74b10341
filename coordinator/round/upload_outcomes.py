"""What devices' uploads came to: each device's last outcome, and rejections counted by reason."""

import threading
import time
from dataclasses import dataclass

# the reasons an upload is refused, one per kind of refusal: a bounded set, fit for a metric's label
REASONS = ("unauthorized", "too_large", "invalid", "not_wanted")
MAX_REASON_CHARS = 200
MAX_DEVICES = 10_000  # devices whose last outcome is kept; the oldest is forgotten first


@dataclass(frozen=True)
class Outcome:
    """A device's latest upload: the round, whether it was accepted, and if not, why."""

    round: int
    accepted: bool
    reason: str  # '' when accepted
    at: float  # Unix time


class UploadOutcomes:
    """The outcomes of uploads since the coordinator started; safe to share across threads."""

    def __init__(self, max_devices: int = MAX_DEVICES) -> None:
        self.max_devices = max_devices
        self._last: dict[str, Outcome] = {}
        self._rejected = dict.fromkeys(REASONS, 0)
        self._lock = threading.Lock()

    def accepted(self, device_id: str, round: int) -> None:
        """Record an accepted update."""
        self._keep(device_id, Outcome(round, True, "", time.time()))

    def rejected(self, device_id: str | None, round: int, kind: str, reason: str) -> None:
        """Record a refused upload of a kind in REASONS; device_id None where no valid token named one."""
        if kind not in REASONS:
            raise ValueError(f"unknown kind of refusal {kind!r}")
        with self._lock:
            self._rejected[kind] += 1
        if device_id is not None:
            self._keep(device_id, Outcome(round, False, reason[:MAX_REASON_CHARS], time.time()))

    def _keep(self, device_id: str, outcome: Outcome) -> None:
        with self._lock:
            self._last.pop(device_id, None)
            self._last[device_id] = outcome
            while len(self._last) > self.max_devices:
                del self._last[next(iter(self._last))]

    def last(self) -> dict[str, Outcome]:
        """Each device's latest outcome."""
        with self._lock:
            return dict(self._last)

    def rejected_counts(self) -> dict[str, int]:
        """Refused uploads by kind, every kind in REASONS present."""
        with self._lock:
            return dict(self._rejected)
