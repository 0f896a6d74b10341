"""The coordinator's part in one secure-sum round: it relays adverts and sealed shares, sums the masked
updates, and unmasks the sum from the shares the survivors give up. It sees no device's update alone.

Every message is checked before it counts; a device whose message fails a check is refused with the
reason (the caller logs it and leaves the device out), and a round left with fewer devices than the
threshold fails rather than give a wrong sum. protocol.secure_sum_phases has the phases.
"""

from collections.abc import Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedspeech.protocol import secure_sum_maths as ss
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.secure_sum_phases import (
    SEALED_SHARE_BYTES,
    Advert,
    SealedShares,
    Unmasking,
    check_advert,
    check_group,
    pair_context,
    seed_digest,
)


class Refused(ProtocolError):
    """A device's message that does not count, and why."""


class ServerRound:
    """One round: take_advert, adverts; take_shares, sharers, shares_for; take_masked, survivors;
    take_unmasking, total.
    """

    def __init__(
        self, round: int, threshold: int, length: int, identities: Mapping[str, Ed25519PublicKey]
    ) -> None:
        if threshold < 2:
            raise ValueError(f"a secure sum needs a threshold of at least 2, not {threshold}")
        self.round, self.threshold, self.length = round, threshold, length
        self._identities = identities
        self._adverts: dict[str, Advert] = {}
        self._holders: list[str] = []  # the advertised devices, in share order, once adverts are out
        self._sealed: dict[str, dict[str, bytes]] = {}  # sender -> receiver -> sealed share
        self._masked: dict[str, np.ndarray] = {}  # summed once the round knows who is left out
        self._replies: dict[str, Unmasking] = {}

    def take_advert(self, advert: Advert) -> None:
        """Phase 1: a device's signed keys."""
        device = advert.device_id
        if self._holders:
            raise Refused(f"the advert of {device} came after the adverts went out")
        if device not in self._identities:
            raise Refused(f"an advert of {device}, a device not in this round")
        if device in self._adverts:
            raise Refused(f"a second advert of {device}")
        check_advert(advert, self.round, self._identities[device])
        self._adverts[device] = advert

    def adverts(self) -> list[Advert]:
        """The adverts to hand every advertised device; no more are taken once these are out."""
        if not self._holders:
            self._holders = sorted(self._adverts)
            check_group(self._holders, self.threshold, "the adverts")
        return [self._adverts[d] for d in self._holders]

    def take_shares(self, shares: SealedShares) -> None:
        """Phase 2: a device's sealed shares, one for each other advertised device."""
        device = shares.device_id
        if device not in self._holders or shares.round != self.round:
            raise Refused(f"shares from {device}, which did not advertise in round {self.round}")
        if device in self._sealed:
            raise Refused(f"a second set of shares from {device}")
        if self._masked:
            raise Refused(f"the shares of {device} came after the masked updates began")
        if set(shares.sealed) != set(self._holders) - {device}:
            raise Refused(f"the shares of {device} are not one for each other advertised device")
        if any(len(sealed) != SEALED_SHARE_BYTES for sealed in shares.sealed.values()):
            raise Refused(f"a share of {device} is not {SEALED_SHARE_BYTES} bytes")
        self._sealed[device] = dict(shares.sealed)

    def sharers(self) -> list[str]:
        """The devices whose shares came in: each masks with every other one of them."""
        sharers = sorted(self._sealed)
        check_group(sharers, self.threshold, "the sharers")
        return sharers

    def shares_for(self, receiver: str) -> dict[str, bytes]:
        """The sealed shares the sharers made for receiver."""
        return {sender: sealed[receiver] for sender, sealed in self._sealed.items() if receiver in sealed}

    def take_masked(self, device: str, masked: np.ndarray) -> None:
        """Phase 3: a sharer's masked update, added to the sum at once."""
        if device not in self._sealed:
            raise Refused(f"a masked update from {device}, which shared no keys this round")
        if device in self._masked:
            raise Refused(f"a second masked update from {device}")
        if self._replies:
            raise Refused(f"the masked update of {device} came after the unmasking began")
        if masked.dtype != np.uint32 or masked.shape != (self.length,):
            raise Refused(f"the masked update of {device} is not {self.length} uint32")
        self._masked[device] = masked

    def survivors(self) -> list[str]:
        """The devices whose masked updates came."""
        survivors = sorted(self._masked)
        check_group(survivors, self.threshold, "the survivors")
        return survivors

    def take_unmasking(self, reply: Unmasking) -> None:
        """Phase 4: a survivor's shares of the survivors' seeds and of the dropped sharers' mask keys."""
        device = reply.device_id
        if device not in self._masked or reply.round != self.round:
            raise Refused(f"an unmasking from {device}, not a survivor of round {self.round}")
        if device in self._replies:
            raise Refused(f"a second unmasking from {device}")
        survivors = set(self._masked)
        dropped = set(self._sealed) - survivors
        seeds, keys, pairs = set(reply.seed_shares), set(reply.key_shares), set(reply.pair_seeds)
        each_once = not (seeds | keys) & pairs and seeds | keys | pairs == survivors | dropped
        if not (each_once and seeds <= survivors and keys <= dropped and device not in pairs):
            raise Refused(f"the unmasking of {device} does not hold one share or pair seed of each it must")
        given = [*reply.seed_shares.values(), *reply.key_shares.values(), *reply.pair_seeds.values()]
        if any(len(s) != ss.SEED_BYTES for s in given):
            raise Refused(f"a share in the unmasking of {device} is not {ss.SEED_BYTES} bytes")
        self._replies[device] = reply

    def total(self) -> tuple[np.ndarray, set[str], dict[str, list[str]]]:
        """The sum of the survivors' encoded updates; the devices that gave up a wrong share; and those
        left out of the sum, each with the devices its shares did not open for. A survivor is left out
        when too few of its shares opened to rebuild its seed (it sent no real ones): its masked update
        is taken out of the sum and its pairwise masks with the others come from their pair seeds.
        ProtocolError when too few replies came, or a secret cannot be rebuilt nor done without.
        """
        check_group(sorted(self._replies), self.threshold, "the unmaskings")
        liars: set[str] = set()
        left_out = {
            owner: sorted(d for d, r in self._replies.items() if owner in r.pair_seeds)
            for owner in self._masked
            if sum(owner in r.seed_shares for r in self._replies.values()) < self.threshold
        }
        counted = sorted(set(self._masked) - set(left_out))
        check_group(counted, self.threshold, "the survivors whose shares opened")
        seeds = []
        for owner in counted:
            seed, wrong = self._rebuilt(owner, "seed_shares", _is_seed_of(self._adverts[owner]))
            seeds.append(seed)
            liars |= wrong
        pairs = []
        for owner in sorted(set(self._sealed) - set(counted)):
            with_owner, wrong = self._pairs_with(owner, counted)
            pairs += with_owner
            liars |= wrong
        total = np.zeros(self.length, dtype=np.uint32)
        for device in counted:
            total += self._masked[device]
        return ss.unmask(total, seeds, pairs), liars, left_out

    def _pairs_with(self, owner: str, counted: list[str]) -> tuple[list[tuple[str, str, bytes]], set[str]]:
        """(survivor, owner, seed) of each counted survivor's pairwise mask with a sharer not in the sum,
        from the survivor's pair seed where it gave one, else from the owner's mask key rebuilt; and the
        holders of wrong shares of that key.
        """
        given = {u: self._reply_of(u).pair_seeds.get(owner) for u in counted}
        missing = [u for u, seed in given.items() if seed is None]
        if not missing:
            return [(u, owner, seed) for u, seed in given.items() if seed is not None], set()
        if owner in self._masked:  # left out of the sum: its mask key's shares were never asked for
            raise ProtocolError(f"round {self.round}: {missing} gave no pair seed with {owner}")
        key_bytes, wrong = self._rebuilt(owner, "key_shares", _is_mask_key_of(self._adverts[owner]))
        key = X25519PrivateKey.from_private_bytes(key_bytes)
        pairs = []
        for u, seed in given.items():
            if seed is None:
                peer = X25519PublicKey.from_public_bytes(self._adverts[u].mask_key)
                seed = ss.pair_seed(key, peer, pair_context(self.round, u, owner))
            pairs.append((u, owner, seed))
        return pairs, wrong

    def _reply_of(self, device: str) -> Unmasking:
        return self._replies.get(device) or Unmasking(device, self.round, {}, {})

    def _rebuilt(self, owner: str, kind: str, check: ss.Check) -> tuple[bytes, set[str]]:
        """An owner's seed or mask key rebuilt from the replies' shares of it; the holders of wrong ones."""
        position = {device: n for n, device in enumerate(self._holders)}
        shares = {
            position[d]: getattr(r, kind)[owner]
            for d, r in self._replies.items()
            if owner in getattr(r, kind)
        }
        secret, wrong = self._rebuild(shares, check, owner)
        return secret, {self._holders[n] for n in wrong}

    def _rebuild(self, shares: Mapping[int, bytes], check: ss.Check, owner: str) -> tuple[bytes, set[int]]:
        try:
            return ss.rebuild_checked(shares, self.threshold, check)
        except ValueError as exc:
            raise ProtocolError(f"round {self.round}: the secret of {owner}: {exc}") from None


def _is_seed_of(advert: Advert) -> ss.Check:
    """Whether a rebuilt seed is the one whose digest the device advertised."""

    def check(seed: bytes) -> bool:
        return seed_digest(seed) == advert.seed_digest

    return check


def _is_mask_key_of(advert: Advert) -> ss.Check:
    """Whether a rebuilt private key is that of the mask key the device advertised."""

    def check(private: bytes) -> bool:
        public = X25519PrivateKey.from_private_bytes(private).public_key()
        return public.public_bytes_raw() == advert.mask_key

    return check
