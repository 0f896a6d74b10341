"""Who may register as which device: enrolment secrets, bearer tokens, open enrolment and the device cap.

A device id that the coordinator knows can only be registered again by whoever holds its current token
or its enrolment secret, so that no stranger takes over a device by posting its id. An unknown id is
accepted only under open enrolment (the demo, emulated fleets), up to a maximum number of devices.
Without open enrolment, an unknown id gets the same refusal as a wrong credential: asking tells no one
which ids are enrolled. Every registration issues a new token; the previous one stops working. A device
the operator revoked is told so when it presents its old token, and only then.
"""

import hmac
import logging
import secrets
import threading
import time
from dataclasses import asdict

from fedspeech.coordinator.broker import broker_users
from fedspeech.coordinator.state.records import CredentialDigests
from fedspeech.coordinator.state.store import Store, token_digest
from fedspeech.protocol import bounds, messages
from fedspeech.protocol.topics import shares_a_user

log = logging.getLogger(__name__)

MAX_DEVICES = 1000  # under open enrolment
# A registration from another identity key this soon after the last is taken as a second device running
# with the same id (each takes the other's token in turn, every few seconds); a device whose state folder
# was replaced registers so once.
SHARED_ID_S = 600.0


class EnrolmentRefused(Exception):
    """A registration the coordinator does not take: status 401 (no good credential) or 403 (fleet full).

    revoked: the credential was the device's token when the operator revoked it.
    """

    def __init__(self, status: int, reason: str, revoked: bool = False) -> None:
        super().__init__(reason)
        self.status, self.revoked = status, revoked


def revoked_reason(device_id: str) -> str:
    """What a revoked device is told when it presents its old token."""
    return (
        f"device {device_id} was revoked on the coordinator: it must be enrolled again "
        f"(`fedspeech devices add {device_id}`) and started with its new secret"
    )


def add_device(store: Store, device_id: str) -> str:
    """Enrol a device and return its secret, shown once (the store keeps its sha256); ValueError if not.

    Where the state keeps the broker's users, the device gets its own (Mosquitto must then reload).
    """
    if not bounds.DEVICE_ID.match(device_id):
        raise ValueError(f"bad device id {device_id!r}: 1 to 64 ASCII letters, digits, '_', '.', '-'")
    if shares_a_user(device_id):
        raise ValueError(
            f"bad device id {device_id!r}: 'coordinator', 'homeassistant' and ids ending in '-listen' name "
            "other broker users"
        )
    secret = secrets.token_urlsafe(32)
    if not store.enrol_device(device_id, secret):
        raise ValueError(f"device {device_id!r} is already known: revoke it first to enrol it again")
    log.info("enrolled device %s", device_id)
    broker_users.device_logins(store.dir, device_id)
    return secret


def revoke_device(store: Store, device_id: str) -> bool:
    """Revoke a device's enrolment, token (its next request is told so) and broker users; False if unknown."""
    revoked = store.delete_device(device_id)
    if revoked:
        log.warning("revoked device %s", device_id)
    if revoked and broker_users.remove_device(store.dir, device_id):
        log.warning(
            "removed %s's broker users: reload Mosquitto (%s) to end its broker login",
            device_id,
            broker_users.reload_hint(store.dir),
        )
    return revoked


def _holds(credential: str, known: CredentialDigests) -> bool:
    """Whether credential is the device's token or its enrolment secret."""
    digest = token_digest(credential)
    return any(bool(d) and hmac.compare_digest(digest, d) for d in (known.token_sha256, known.secret_sha256))


class Enrolment:
    """The registration rules over one store; registrations are decided one at a time."""

    def __init__(self, store: Store, open_enrolment: bool, max_devices: int = MAX_DEVICES) -> None:
        if max_devices < 1:
            raise ValueError(f"MAX_DEVICES must be at least 1, got {max_devices}")
        self.store, self.open, self.max_devices = store, open_enrolment, max_devices
        self._lock = threading.Lock()  # between the check and the write, no other registration
        self._shared: dict[str, float] = {}  # device ids two devices register with: when last seen so

    def register(self, registration: messages.Registration, credential: str | None) -> str:
        """A new token for the device, the old one revoked; EnrolmentRefused says why not."""
        device_id = registration.device_id
        with self._lock:
            known = self.store.credentials(device_id)
            if known is None or credential is None or not _holds(credential, known):
                self._admit_new(device_id, known is not None, credential)
            token = secrets.token_urlsafe(32)
            self.store.register_device(
                device_id, token, registration.num_samples, asdict(registration.profile),
                registration.test_counts, registration.identity_key or "",
            )  # fmt: skip
        if known is not None and known.token_sha256:
            log.warning("device %s registered again: its previous token no longer works", device_id)
            self._check_shared(device_id, known, registration.identity_key or "")
        log.info(
        "registered device %s (%d samples, %d test clips)",
        device_id, registration.num_samples, sum(registration.test_counts.values()),
    )  # fmt: skip
        return token

    def shared_ids(self) -> set[str]:
        """The device ids that two devices registered with in the last SHARED_ID_S seconds."""
        now = time.time()
        return {device for device, seen in self._shared.items() if now - seen < SHARED_ID_S}

    def _check_shared(self, device_id: str, known: CredentialDigests, identity_key: str) -> None:
        """Warn, and remember, when a registration comes from another device than the last, soon after it."""
        since = time.time() - known.registered_at
        if not known.identity_key or identity_key in ("", known.identity_key) or since >= SHARED_ID_S:
            return
        self._shared[device_id] = time.time()
        log.warning(
            "device %s registered from another device (another identity key) %.0f s after the last: two "
            "devices run with the id %s and take each other's token in turn; give each its own --device-id "
            "(and `fedspeech devices add` it). A device whose --state folder was replaced registers so once.",
            device_id, since, device_id,
        )  # fmt: skip

    def _admit_new(self, device_id: str, known: bool, credential: str | None) -> None:
        """Return if device_id may register as a new device; else EnrolmentRefused."""
        if credential is not None and self.store.revoked_device(credential) == device_id:
            raise EnrolmentRefused(401, revoked_reason(device_id), revoked=True)
        if known or not self.open:
            # the same answer for an id that is not enrolled as for a missing or wrong credential, so that
            # no one learns which ids are enrolled by asking
            raise EnrolmentRefused(
                401,
                f"device {device_id} is not enrolled, or its token or enrolment secret is missing or wrong "
                f"(`fedspeech devices add {device_id}` enrols it)",
            )
        if self.store.count_devices() >= self.max_devices:
            raise EnrolmentRefused(403, f"the fleet already has the maximum of {self.max_devices} devices")
