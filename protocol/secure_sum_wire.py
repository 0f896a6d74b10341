"""A secure-sum round's messages on the wire: small JSON bodies over HTTP, bytes in base64, every field
bounded; the masked update as raw little-endian uint32. The device and round of a body come from its
bearer token and its URL, never from the body. ProtocolError says what is wrong with a body.
"""

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedspeech.protocol import signing
from fedspeech.protocol.bounds import DEVICE_ID, ProtocolError
from fedspeech.protocol.message_checks import MAX_SECURE_DEVICES
from fedspeech.protocol.secure_sum_maths import SEED_BYTES
from fedspeech.protocol.secure_sum_phases import (
    KEY_BYTES,
    SEALED_SHARE_BYTES,
    Advert,
    SealedShares,
    Unmasking,
)

SIGNATURE_BYTES = 64
# the largest body of the round: the adverts, each with its device's identity key, as base64 JSON
MAX_BODY_BYTES = MAX_SECURE_DEVICES * 400 + 1024


def _text(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _bytes(value: Any, length: int, what: str) -> bytes:
    """length bytes from their base64 text; ProtocolError for anything else."""
    if not isinstance(value, str) or len(value) > 4 * length:
        raise ProtocolError(f"{what}: not {length} bytes in base64")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"{what}: bad base64") from None
    if len(raw) != length:
        raise ProtocolError(f"{what}: {len(raw)} bytes, not {length}")
    return raw


def _device(value: Any, what: str) -> str:
    if not isinstance(value, str) or not DEVICE_ID.match(value):
        raise ProtocolError(f"{what}: not a device id")
    return value


def _by_device(value: Any, length: int, what: str) -> dict[str, bytes]:
    """A JSON object of device id -> length bytes in base64, of at most MAX_SECURE_DEVICES entries."""
    if not isinstance(value, dict) or len(value) > MAX_SECURE_DEVICES:
        raise ProtocolError(f"{what}: not an object of at most {MAX_SECURE_DEVICES} devices")
    return {_device(k, what): _bytes(v, length, f"{what} of {k}") for k, v in value.items()}


def _devices(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_SECURE_DEVICES:
        raise ProtocolError(f"{what}: not a list of at most {MAX_SECURE_DEVICES} devices")
    return [_device(v, what) for v in value]


def _object(body: bytes | str) -> dict[str, Any]:
    if len(body) > MAX_BODY_BYTES:
        raise ProtocolError(f"a body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        raise ProtocolError("not JSON") from None
    if not isinstance(value, dict):
        raise ProtocolError("not a JSON object")
    return value


def _dump(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def advert_body(advert: Advert) -> bytes:
    """Phase 1, device to coordinator: its keys, its seed's digest and its signature."""
    fields = ("share_key", "mask_key", "seed_digest", "signature")
    return _dump({name: _text(getattr(advert, name)) for name in fields})


def read_advert(body: bytes, device_id: str, round: int) -> Advert:
    """The advert of device_id in round from its body (its signature is checked by the caller)."""
    return _advert(_object(body), device_id, round)


def _advert(value: Mapping[str, Any], device_id: str, round: int) -> Advert:
    """The advert of device_id in round from its parsed fields."""
    keys = {
        name: _bytes(value.get(name), KEY_BYTES, name) for name in ("share_key", "mask_key", "seed_digest")
    }
    return Advert(
        device_id, round, signature=_bytes(value.get("signature"), SIGNATURE_BYTES, "signature"), **keys
    )


def adverts_body(adverts: list[Advert], identities: Mapping[str, str]) -> bytes:
    """Phase 1's outcome, coordinator to every device: the adverts, each with its device's identity key."""
    entries = [
        {"device_id": a.device_id, "identity_key": identities[a.device_id], **json.loads(advert_body(a))}
        for a in adverts
    ]
    return _dump({"adverts": entries})


def read_adverts(body: bytes, round: int) -> tuple[list[Advert], dict[str, Ed25519PublicKey]]:
    """The adverts of round and their devices' identity keys, from phase 1's outcome."""
    entries = _object(body).get("adverts")
    if not isinstance(entries, list) or len(entries) > MAX_SECURE_DEVICES:
        raise ProtocolError(f"adverts: not a list of at most {MAX_SECURE_DEVICES}")
    adverts, identities = [], {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise ProtocolError("adverts: an entry is not an object")
        device = _device(entry.get("device_id"), "an advert's device")
        key = entry.get("identity_key")
        if not isinstance(key, str):
            raise ProtocolError(f"the identity key of {device} is not text")
        identities[device] = signing.parse_public_key(key)
        adverts.append(_advert(entry, device, round))
    return adverts, identities


def shares_body(shares: SealedShares) -> bytes:
    """Phase 2, device to coordinator: a sealed share for every other advertised device."""
    return _dump({"sealed": {k: _text(v) for k, v in shares.sealed.items()}})


def read_shares(body: bytes, device_id: str, round: int) -> SealedShares:
    """The sealed shares of device_id in round from their body."""
    return SealedShares(
        device_id, round, _by_device(_object(body).get("sealed"), SEALED_SHARE_BYTES, "sealed")
    )


def sharers_body(sharers: list[str], shares: Mapping[str, bytes]) -> bytes:
    """Phase 2's outcome, coordinator to one device: the sharers, and the shares sealed for it."""
    return _dump({"sharers": sharers, "shares": {k: _text(v) for k, v in shares.items()}})


def read_sharers(body: bytes) -> tuple[list[str], dict[str, bytes]]:
    """The sharers and the sealed shares for this device, from phase 2's outcome."""
    value = _object(body)
    return _devices(value.get("sharers"), "sharers"), _by_device(
        value.get("shares"), SEALED_SHARE_BYTES, "shares"
    )


def masked_body(masked: np.ndarray) -> bytes:
    """Phase 3, device to coordinator: its masked update, little-endian uint32."""
    return np.asarray(masked, dtype="<u4").tobytes()


def read_masked(body: bytes, length: int) -> np.ndarray:
    """A masked update of length values from its body."""
    if len(body) != 4 * length:
        raise ProtocolError(f"a masked update of {len(body)} bytes, not {4 * length}")
    return np.frombuffer(body, dtype="<u4").astype(np.uint32)


def survivors_body(survivors: list[str]) -> bytes:
    """Phase 3's outcome, coordinator to every survivor: whose masked updates are in the sum."""
    return _dump({"survivors": survivors})


def read_survivors(body: bytes) -> list[str]:
    """The survivors, from phase 3's outcome."""
    return _devices(_object(body).get("survivors"), "survivors")


def unmasking_body(reply: Unmasking) -> bytes:
    """Phase 4, survivor to coordinator: the shares it gives up."""
    return _dump(
        {
            "seed_shares": {k: _text(v) for k, v in reply.seed_shares.items()},
            "key_shares": {k: _text(v) for k, v in reply.key_shares.items()},
            "pair_seeds": {k: _text(v) for k, v in reply.pair_seeds.items()},
        }
    )


def read_unmasking(body: bytes, device_id: str, round: int) -> Unmasking:
    """The unmasking of device_id in round from its body."""
    value = _object(body)
    seeds = _by_device(value.get("seed_shares"), SEED_BYTES, "seed_shares")
    keys = _by_device(value.get("key_shares"), SEED_BYTES, "key_shares")
    pairs = _by_device(value.get("pair_seeds", {}), SEED_BYTES, "pair_seeds")
    return Unmasking(device_id, round, seeds, keys, pairs)
