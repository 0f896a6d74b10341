"""Who may register as which device: enrolment secrets, bearer tokens, open enrolment and the device cap.

A device id that the coordinator knows can only be registered again by whoever holds its current token
or its enrolment secret, so that no stranger takes over a device by posting its id. An unknown id is
accepted only under open enrolment (the demo, emulated fleets), up to a maximum number of devices.
Every registration issues a new token; the previous one stops working.
"""

import hmac
import logging
import secrets
import threading
from dataclasses import asdict

from fedspeech.coordinator.store import Store, token_digest
from fedspeech.protocol import bounds, messages

log = logging.getLogger(__name__)

MAX_DEVICES = 1000  # under open enrolment


class EnrolmentRefused(Exception):
    """A registration the coordinator does not take: status 401 (bad credential) or 403 (not enrolled)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def add_device(store: Store, device_id: str) -> str:
    """Enrol a device and return its secret, shown once (the store keeps its sha256); ValueError if not."""
    if not bounds.DEVICE_ID.match(device_id):
        raise ValueError(f"bad device id {device_id!r}: 1 to 64 letters, digits, '_', '.', '-'")
    secret = secrets.token_urlsafe(32)
    if not store.enrol_device(device_id, secret):
        raise ValueError(f"device {device_id!r} is already known: revoke it first to enrol it again")
    log.info("enrolled device %s", device_id)
    return secret


def revoke_device(store: Store, device_id: str) -> bool:
    """Forget a device's token and enrolment: its next request gets 401. False for an unknown device."""
    revoked = store.delete_device(device_id)
    if revoked:
        log.warning("revoked device %s", device_id)
    return revoked


def _matches(credential: str, digest: str) -> bool:
    return bool(digest) and hmac.compare_digest(token_digest(credential), digest)


class Enrolment:
    """The registration rules over one store; registrations are decided one at a time."""

    def __init__(self, store: Store, open_enrolment: bool, max_devices: int = MAX_DEVICES) -> None:
        if max_devices < 1:
            raise ValueError(f"MAX_DEVICES must be at least 1, got {max_devices}")
        self.store, self.open, self.max_devices = store, open_enrolment, max_devices
        self._lock = threading.Lock()  # between the check and the write, no other registration

    def register(self, registration: messages.Registration, credential: str | None) -> str:
        """A new token for the device, the old one revoked; EnrolmentRefused says why not."""
        device_id = registration.device_id
        with self._lock:
            known = self.store.credentials(device_id)
            if known is None:
                if not self.open:
                    raise EnrolmentRefused(
                        403, f"device {device_id} is not enrolled (`fedspeech devices add {device_id}`)"
                    )
                if self.store.count_devices() >= self.max_devices:
                    raise EnrolmentRefused(
                        403, f"the fleet already has the maximum of {self.max_devices} devices"
                    )
            elif credential is None:
                raise EnrolmentRefused(
                    401, f"device {device_id} is already known: its token or secret is needed"
                )
            elif not (_matches(credential, known.token_sha256) or _matches(credential, known.secret_sha256)):
                raise EnrolmentRefused(401, f"wrong token or enrolment secret for device {device_id}")
            token = secrets.token_urlsafe(32)
            self.store.register_device(
                device_id, token, registration.num_samples, asdict(registration.profile),
                registration.test_counts,
            )  # fmt: skip
        if known is not None and known.token_sha256:
            log.warning("device %s registered again: its previous token no longer works", device_id)
        log.info(
        "registered device %s (%d samples, %d test clips)",
        device_id, registration.num_samples, sum(registration.test_counts.values()),
    )  # fmt: skip
        return token
