"""Secure aggregation's arithmetic, after Bonawitz et al. 2017, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning": pure functions, no network.

A device's update is clipped and scaled to fixed point, an integer modulo 2^32 per weight, then masked:
a self mask expanded from a seed of its own, and for every other device of the round a pairwise mask
expanded from the seed its X25519 agreement with that device gives, added by the lower id of the two and
subtracted by the higher, so that pairwise masks cancel in the sum. One masked vector alone is uniform
noise. To unmask the sum, the coordinator takes away the survivors' self masks, from seeds rebuilt from
their Shamir shares, and the pairwise masks that did not cancel because a device dropped out after the
agreement, from that device's private key rebuilt the same way. Shares are t of n: fewer than t holders
learn nothing of a secret (Shamir's secret sharing, from pycryptodome). Devices hand each other their
shares through the coordinator sealed (ChaCha20-Poly1305 under a second agreed key), and a rebuilt
secret is checked against what its owner published, which tells a wrong share from a right one.
"""

import itertools
import math
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from Cryptodome.Protocol.SecretSharing import Shamir
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SEED_BYTES = 32  # a ChaCha20 key
_BLOCK = 16  # Shamir shares 16-byte secrets: longer ones are shared a block at a time
_RING = np.uint32  # arithmetic modulo 2^32, numpy's own wrap-around
_MAX_SUM = 2**31 - 1  # the largest magnitude a signed sum can reach without wrapping


@dataclass(frozen=True)
class FixedPoint:
    """Floats in [-clip, clip] as integers modulo 2^32, scaled so that the sum of `devices` of them never
    wraps; the decoded sum is off by at most `max_error` per weight.
    """

    clip: float
    devices: int

    def __post_init__(self) -> None:
        if not self.clip > 0:
            raise ValueError(f"the clip must be positive, not {self.clip}")
        if not 1 <= self.devices <= 100_000:
            raise ValueError(f"devices must be between 1 and 100000, not {self.devices}")

    @property
    def scale(self) -> float:
        """Integer steps per unit: the sum of `devices` values at the clip stays within a signed 32 bits."""
        return _MAX_SUM // self.devices / self.clip

    @property
    def max_error(self) -> float:
        """The most a decoded sum of `devices` encodings can differ from the exact sum, per weight."""
        return self.devices * 0.5 / self.scale

    def encode(self, values: np.ndarray) -> np.ndarray:
        """values clipped to [-clip, clip], rounded to the nearest step, as uint32 (two's complement)."""
        clipped = np.clip(np.asarray(values, dtype=np.float64), -self.clip, self.clip)
        return np.rint(clipped * self.scale).astype(np.int64).astype(_RING)

    def decode(self, total: np.ndarray) -> np.ndarray:
        """The float sum of at most `devices` encodings summed modulo 2^32."""
        return np.asarray(total, dtype=_RING).view(np.int32).astype(np.float64) / self.scale


NOISE_TAILS = 8  # deviations of a device's noise that the fixed point's range holds beyond the clip


def fixed_point(clip: float, noise: float, devices: int) -> FixedPoint:
    """The fixed point of a sum of `devices` changes clipped to clip, each with Gaussian noise of
    deviation `noise`: its range holds the clip and NOISE_TAILS deviations more, so the sum never wraps.
    """
    return FixedPoint(clip + NOISE_TAILS * noise, devices)


def vector_bound(clip: float, count_scale: float) -> float:
    """The L2 norm of what a device puts into the sum at most: its change clipped to clip, and its
    +count_scale/2 or -count_scale/2 where the round counts the changes within the clip.
    """
    return math.hypot(clip, count_scale / 2)


def with_noise(encoded: np.ndarray, noise: float, fixed: FixedPoint, rng: np.random.Generator) -> np.ndarray:
    """encoded with Gaussian noise of deviation `noise` added, rounded to fixed's steps, modulo 2^32."""
    steps = np.rint(rng.normal(0.0, noise * fixed.scale, len(encoded))).astype(np.int64)
    return (np.asarray(encoded, dtype=_RING).astype(np.int64) + steps).astype(_RING)


def expand(seed: bytes, length: int) -> np.ndarray:
    """length pseudo-random uint32 from a 32-byte seed: the ChaCha20 key stream under a zero nonce (each
    seed is used for one vector only: self seeds are drawn anew each round, pairwise ones bound to it).
    """
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a seed has {SEED_BYTES} bytes, not {len(seed)}")
    stream = Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor()
    return np.frombuffer(stream.update(bytes(4 * length)), dtype="<u4").astype(_RING)


def new_seed() -> bytes:
    """A fresh self-mask seed from the operating system's random source."""
    return os.urandom(SEED_BYTES)


def _agreed(own: X25519PrivateKey, peer: X25519PublicKey, purpose: bytes, context: bytes) -> bytes:
    """32 bytes two devices derive alike: their X25519 agreement through HKDF-SHA256, bound to a purpose
    and a context (the round and the two ids), so that no other use or round can reuse them.
    """
    kdf = HKDF(algorithm=hashes.SHA256(), length=SEED_BYTES, salt=None, info=purpose + b"\0" + context)
    return kdf.derive(own.exchange(peer))


def pair_seed(own: X25519PrivateKey, peer: X25519PublicKey, context: bytes) -> bytes:
    """The seed of the pairwise mask two devices share."""
    return _agreed(own, peer, b"fedspeech pair mask", context)


def seal_share(own: X25519PrivateKey, peer: X25519PublicKey, context: bytes, share: bytes) -> bytes:
    """A share for peer, which only peer can open, through the coordinator: ChaCha20-Poly1305 under the
    key of their agreement, context (the round, sender and receiver) authenticated with it.
    """
    nonce = os.urandom(12)
    key = _agreed(own, peer, b"fedspeech share", context)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, share, context)


def open_share(own: X25519PrivateKey, peer: X25519PublicKey, context: bytes, sealed: bytes) -> bytes:
    """The share peer sealed for this device; ValueError if it was altered, or sealed for another context."""
    if len(sealed) < 12 + 16:
        raise ValueError(f"a sealed share has at least 28 bytes, not {len(sealed)}")
    key = _agreed(own, peer, b"fedspeech share", context)
    try:
        return ChaCha20Poly1305(key).decrypt(sealed[:12], sealed[12:], context)
    except InvalidTag:
        raise ValueError("a sealed share that does not open: altered, or sealed for another round") from None


def pair_mask(own_id: str, peer_id: str, seed: bytes, length: int) -> np.ndarray:
    """The pairwise mask own_id adds for peer_id: the seed's expansion, negated by the higher id."""
    if own_id == peer_id:
        raise ValueError(f"a device shares no pairwise mask with itself ({own_id!r})")
    stream = expand(seed, length)
    return stream if own_id < peer_id else (_RING(0) - stream)


def mask(encoded: np.ndarray, own_id: str, self_seed: bytes, pair_seeds: Mapping[str, bytes]) -> np.ndarray:
    """A device's encoded update, plus its self mask and its pairwise mask with each other device."""
    masked = np.asarray(encoded, dtype=_RING) + expand(self_seed, len(encoded))
    for peer_id, seed in pair_seeds.items():
        masked += pair_mask(own_id, peer_id, seed, len(encoded))
    return masked


def unmask(
    total: np.ndarray, self_seeds: Iterable[bytes], dropped_pairs: Iterable[tuple[str, str, bytes]]
) -> np.ndarray:
    """The sum of the survivors' encoded updates, from the sum of their masked ones: less each survivor's
    self mask, and less each (survivor, dropped device, seed) pairwise mask that has no partner in the sum.
    """
    plain = np.array(total, dtype=_RING)
    for seed in self_seeds:
        plain -= expand(seed, len(plain))
    for survivor, dropped, seed in dropped_pairs:
        plain -= pair_mask(survivor, dropped, seed, len(plain))
    return plain


def split_secret(secret: bytes, threshold: int, holders: int) -> list[bytes]:
    """Shamir shares of secret (a multiple of 16 bytes), one per holder in order: any `threshold` of
    them rebuild it, fewer reveal nothing.
    """
    if not secret or len(secret) % _BLOCK:
        raise ValueError(f"a shared secret is a positive multiple of {_BLOCK} bytes, not {len(secret)}")
    if not 2 <= threshold <= holders <= 255:
        raise ValueError(f"need 2 <= threshold <= holders <= 255, not {threshold} of {holders}")
    pieces = [secret[i : i + _BLOCK] for i in range(0, len(secret), _BLOCK)]
    blocks = [Shamir.split(threshold, holders, piece, ssss=False) for piece in pieces]
    return [b"".join(block[holder][1] for block in blocks) for holder in range(holders)]


def combine_secret(shares: Mapping[int, bytes], threshold: int) -> bytes:
    """The secret from at least `threshold` shares, keyed by holder position (0-based, as split_secret
    handed them out). A wrong share gives a wrong secret, not an error: check the result against what the
    secret's owner published (its public key, its seed's digest).
    """
    if len(shares) < threshold:
        raise ValueError(f"{len(shares)} shares cannot rebuild a secret that needs {threshold}")
    lengths = {len(share) for share in shares.values()}
    if len(lengths) != 1 or (length := lengths.pop()) % _BLOCK or not length:
        raise ValueError("shares of one secret have one length, a positive multiple of 16 bytes")
    chosen: Sequence[tuple[int, bytes]] = sorted(shares.items())[:threshold]
    return b"".join(
        Shamir.combine([(holder + 1, share[i : i + _BLOCK]) for holder, share in chosen], ssss=False)
        for i in range(0, length, _BLOCK)
    )


Check = Callable[[bytes], bool]  # whether a rebuilt secret is the one its owner published


def rebuild_checked(
    shares: Mapping[int, bytes], threshold: int, check: Check, max_tries: int = 1000
) -> tuple[bytes, set[int]]:
    """The secret that passes check (it matches its owner's published key or digest), rebuilt from some
    `threshold` of the shares, and the holders of wrong shares. The first `threshold` shares usually
    rebuild it, and then no other is looked at (a wrong share that was not needed is not named: rebuilding
    is the dear part, tens of milliseconds for fifty shares). ValueError when no subset tried passes: too
    many wrong shares to tell which.
    """
    holders = sorted(shares)
    draw = random.Random(0)  # then subsets at random: with few wrong shares among many, one is soon clean
    drawn = (draw.sample(holders, threshold) for _ in range(max_tries))
    subsets = itertools.chain([holders[:threshold]], drawn)
    for tries, chosen in enumerate(subsets):
        secret = combine_secret({h: shares[h] for h in chosen}, threshold)
        if not check(secret):
            continue
        if not tries:
            return secret, set()
        good = chosen[:-1]  # each other share, with threshold - 1 good ones, must rebuild the same secret
        wrong = {
            h
            for h in holders
            if h not in chosen and combine_secret({g: shares[g] for g in (*good, h)}, threshold) != secret
        }
        return secret, wrong
    raise ValueError(
        f"no {threshold} of the {len(shares)} shares tried rebuild the secret its owner published"
    )


def layout(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """The arrays a secure sum carries, in its order: the floating-point ones, by name."""
    return sorted(name for name, array in arrays.items() if np.issubdtype(array.dtype, np.floating))


def change_vector(
    trained: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray], clip: float
) -> tuple[np.ndarray, float]:
    """trained's change from received as one float64 vector in layout(received)'s order, scaled down to
    L2 norm clip if it is longer, and its norm before. ValueError if trained lacks an array or has one of
    another shape.
    """
    parts = []
    for name in layout(received):
        if name not in trained or trained[name].shape != received[name].shape:
            raise ValueError(f"the trained model's {name} does not match the one received")
        parts.append(trained[name].astype(np.float64).ravel() - received[name].astype(np.float64).ravel())
    change = np.concatenate(parts) if parts else np.zeros(0)
    norm = float(np.linalg.norm(change))
    return (change * (clip / norm) if norm > clip else change), norm


def with_change(current: Mapping[str, np.ndarray], change: np.ndarray) -> dict[str, np.ndarray]:
    """current with a vector in layout(current)'s order added to its arrays; the others as they are."""
    names = layout(current)
    if len(change) != sum(current[name].size for name in names):
        raise ValueError(f"a change of {len(change)} values for a model of another size")
    result, start = dict(current), 0
    for name in names:
        array = current[name]
        step = change[start : start + array.size].reshape(array.shape)
        result[name] = (array.astype(np.float64) + step).astype(array.dtype)
        start += array.size
    return result
