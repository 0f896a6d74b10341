"""A device's part in one secure-sum round: fresh keys and seed, then each phase's reply, refusing
whatever would let the coordinator learn its update alone (protocol.secure_sum_phases has the phases).
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedspeech.protocol import secure_sum_maths as ss
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import SecureSum
from fedspeech.protocol.secure_sum_phases import (
    Advert,
    SealedShares,
    Unmasking,
    check_advert,
    check_group,
    pair_context,
    seed_digest,
    share_context,
)


def encode_change(change: np.ndarray, norm: float, secure: SecureSum, rng: np.random.Generator) -> np.ndarray:
    """A clipped change (of `norm` before clipping) as this device puts it into the sum: weighted, with
    its +1/2 or -1/2 after it where the round counts the changes within the clip, in fixed point, with its
    part of the sum's noise where the round asks for one.
    """
    vector = change * secure.weight
    if secure.count_scale:
        vector = np.append(vector, (0.5 if norm <= secure.clip else -0.5) * secure.count_scale)
    fixed = ss.fixed_point(ss.vector_bound(secure.clip, secure.count_scale), secure.noise, secure.devices)
    encoded = fixed.encode(vector)
    return ss.with_noise(encoded, secure.noise, fixed, rng) if secure.noise else encoded


class DeviceRound:
    """One device in one round: `advert`, `share`, `masked`, `unmask`, in that order."""

    def __init__(self, device_id: str, round: int, threshold: int, identity: Ed25519PrivateKey) -> None:
        self.device_id, self.round, self.threshold = device_id, round, threshold
        self._identity = identity
        self._share_key, self._mask_key = X25519PrivateKey.generate(), X25519PrivateKey.generate()
        self._seed = ss.new_seed()
        self._adverts: dict[str, Advert] = {}
        self._own_share = b""  # this device's share of its own seed and mask key
        self._sharers: list[str] = []
        self._answered = False

    def advert(self) -> Advert:
        """Phase 1: this device's public keys and seed digest, signed."""
        unsigned = Advert(
            self.device_id,
            self.round,
            self._share_key.public_key().public_bytes_raw(),
            self._mask_key.public_key().public_bytes_raw(),
            seed_digest(self._seed),
            b"",
        )
        return replace(unsigned, signature=self._identity.sign(unsigned.signed_bytes()))

    def share(self, adverts: Sequence[Advert], identities: Mapping[str, Ed25519PublicKey]) -> SealedShares:
        """Phase 2: every advertised device's share of this device's seed and mask key, sealed for it."""
        ids = sorted(a.device_id for a in adverts)
        check_group(ids, self.threshold, "the adverts")
        if self.device_id not in ids:
            raise ProtocolError("the adverts leave this device out")
        for advert in adverts:
            if advert.device_id not in identities:
                raise ProtocolError(f"an advert of {advert.device_id}, a device this one does not know")
            check_advert(advert, self.round, identities[advert.device_id])
        self._adverts = {a.device_id: a for a in adverts}
        seed_shares = ss.split_secret(self._seed, self.threshold, len(ids))
        key_shares = ss.split_secret(self._mask_key.private_bytes_raw(), self.threshold, len(ids))
        sealed = {
            other: ss.seal_share(
                self._share_key,
                self._public(other, "share_key"),
                share_context(self.round, self.device_id, other),
                seed_shares[n] + key_shares[n],
            )
            for n, other in enumerate(ids)
            if other != self.device_id
        }
        own = ids.index(self.device_id)
        self._own_share = seed_shares[own] + key_shares[own]
        return SealedShares(self.device_id, self.round, sealed)

    def masked(self, encoded: np.ndarray, sharers: Sequence[str]) -> np.ndarray:
        """Phase 3: the encoded update masked with this device's seed and with every other sharer."""
        sharers = sorted(sharers)
        check_group(sharers, self.threshold, "the sharers")
        if self.device_id not in sharers or not set(sharers) <= set(self._adverts):
            raise ProtocolError("the sharers must be advertised devices, this one among them")
        self._sharers = sharers
        pairs = {other: self._pair_seed(other) for other in sharers if other != self.device_id}
        return ss.mask(encoded, self.device_id, self._seed, pairs)

    def _pair_seed(self, other: str) -> bytes:
        context = pair_context(self.round, self.device_id, other)
        return ss.pair_seed(self._mask_key, self._public(other, "mask_key"), context)

    def unmask(self, survivors: Sequence[str], sealed_to_me: Mapping[str, bytes]) -> Unmasking:
        """Phase 4, once: the shares held of each survivor's seed and of each dropped sharer's mask key.

        A sharer whose sealed share does not open (it sent no real one) gets no share from this device:
        the seed of their pairwise mask goes instead, which lets the sum be unmasked without it. Only
        while the shares of at least a threshold of the others opened: each of their pair masks stays
        secret, and fewer than a threshold of devices may collude, so a coordinator that spoils shares on
        their way learns nothing of this device's update; with more spoiled, this device drops out.
        """
        if self._answered:
            raise ProtocolError("this device has already given up its shares for this round")
        survivors = sorted(survivors)
        check_group(survivors, self.threshold, "the survivors")
        if self.device_id not in survivors or not set(survivors) <= set(self._sharers):
            raise ProtocolError("the survivors must be sharers, this one among them")
        half = len(self._own_share) // 2  # a seed's share, then a mask key's: both 32 bytes
        seeds, keys, pairs = {}, {}, {}
        for owner in self._sharers:
            if owner == self.device_id:
                share = self._own_share
            else:
                sealed = sealed_to_me.get(owner)
                if sealed is None:
                    raise ProtocolError(f"no share from {owner}, a sharer")
                try:
                    share = ss.open_share(
                        self._share_key,
                        self._public(owner, "share_key"),
                        share_context(self.round, owner, self.device_id),
                        sealed,
                    )
                except ValueError:
                    pairs[owner] = self._pair_seed(owner)
                    continue
            if owner in survivors:
                seeds[owner] = share[:half]
            else:
                keys[owner] = share[half:]
        opened = len(self._sharers) - 1 - len(pairs)
        if pairs and opened < self.threshold:
            raise ProtocolError(
                f"the shares of {len(pairs)} sharers did not open and of only {opened} did: too few to "
                "give pair seeds in their place"
            )
        self._answered = True
        return Unmasking(self.device_id, self.round, seeds, keys, pairs)

    def _public(self, device: str, name: str) -> X25519PublicKey:
        return X25519PublicKey.from_public_bytes(getattr(self._adverts[device], name))
