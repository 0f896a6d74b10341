"""The messages of a secure-sum round and the checks every receiver makes, after the four rounds of
Bonawitz et al. 2017: each device advertises two X25519 public keys and its self-mask seed's digest,
signed with its identity key; hands every other device a share of its seed and of its mask key, sealed;
uploads its masked update; and, once the coordinator says who uploaded, gives up the shares it holds:
of each survivor's seed, and of each dropped device's mask key, never both for one device.

Bytes are raw here; the wire encodes them.
"""

import hashlib
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.message_checks import MAX_SECURE_DEVICES

KEY_BYTES = 32  # an X25519 public key, a sha256 digest
SEALED_SHARE_BYTES = 12 + 2 * 32 + 16  # nonce, a seed's and a mask key's shares, tag
MAX_DEVICES = MAX_SECURE_DEVICES


@dataclass(frozen=True)
class Advert:
    """Phase 1, a device to every other through the coordinator: the keys it agrees with, signed."""

    device_id: str
    round: int
    share_key: bytes  # X25519 public key: sealing shares
    mask_key: bytes  # X25519 public key: pairwise masks
    seed_digest: bytes  # sha256 of its self-mask seed, to check the seed when it is rebuilt
    signature: bytes  # Ed25519, by the device's identity key, over all of the above

    def signed_bytes(self) -> bytes:
        """What the signature covers."""
        head = f"fedspeech advert\0{self.device_id}\0{self.round}\0".encode()
        return head + self.share_key + self.mask_key + self.seed_digest


@dataclass(frozen=True)
class SealedShares:
    """Phase 2, a device to the coordinator: one sealed share per other device that advertised."""

    device_id: str
    round: int
    sealed: dict[str, bytes]  # receiver -> its share, sealed so that only it can open it


@dataclass(frozen=True)
class Unmasking:
    """Phase 4, a survivor to the coordinator: the shares it holds of each survivor's seed and of each
    dropped device's mask key; for a device whose share it could not open, their pair's mask seed instead.
    """

    device_id: str
    round: int
    seed_shares: dict[str, bytes]
    key_shares: dict[str, bytes]
    # a sharer whose sealed share did not open -> the seed of this device's pairwise mask with it, so
    # that the sum can be unmasked without that sharer's secrets (it is left out of the sum if no
    # threshold of shares rebuilds them)
    pair_seeds: dict[str, bytes] = field(default_factory=dict)


def seed_digest(seed: bytes) -> bytes:
    """The digest a device publishes of its self-mask seed."""
    return hashlib.sha256(b"fedspeech seed\0" + seed).digest()


def check_advert(advert: Advert, round: int, identity: Ed25519PublicKey) -> None:
    """ProtocolError unless the advert is for this round, well formed, and signed by its device."""
    if advert.round != round:
        raise ProtocolError(f"an advert of {advert.device_id} for round {advert.round}, not {round}")
    for name in ("share_key", "mask_key", "seed_digest"):
        if len(getattr(advert, name)) != KEY_BYTES:
            raise ProtocolError(f"the advert of {advert.device_id}: {name} has {KEY_BYTES} bytes")
    if advert.share_key == advert.mask_key:
        raise ProtocolError(f"the advert of {advert.device_id} uses one key for sharing and masking")
    try:
        identity.verify(advert.signature, advert.signed_bytes())
    except InvalidSignature:
        raise ProtocolError(f"the advert of {advert.device_id} is not signed by its device") from None


def check_group(devices: list[str], threshold: int, what: str) -> None:
    """ProtocolError unless a group of devices is distinct and at least the threshold in number."""
    if len(set(devices)) != len(devices):
        raise ProtocolError(f"{what} names a device twice")
    if len(devices) < threshold:
        raise ProtocolError(f"{what}: {len(devices)} devices, fewer than the {threshold} the round needs")
    if len(devices) > MAX_DEVICES:
        raise ProtocolError(f"{what}: {len(devices)} devices, more than {MAX_DEVICES}")


def pair_context(round: int, a: str, b: str) -> bytes:
    """What binds a pair's mask seed to this round and these two devices, in either order."""
    low, high = sorted((a, b))
    return f"{round}\0{low}\0{high}".encode()


def share_context(round: int, sender: str, receiver: str) -> bytes:
    """What binds a sealed share to this round, its sender and its receiver."""
    return f"{round}\0{sender}\0{receiver}".encode()
