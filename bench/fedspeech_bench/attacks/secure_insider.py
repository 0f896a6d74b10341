"""Attacks on secure aggregation by an enrolled device, for `fedspeech bench attacks` only: the insider's
daemon with its part in the secure sum patched, in its own process, from round `from_round` on.

"random_shares" hands out sealed shares of the right length that open for no one; "silent_after_keys"
agrees its keys and hands out its shares, then sends nothing more; "short_vector" sends its masked
vector 4 bytes short; "unbounded" sends its change reversed and 1,000 times as long, skipping the clip
its device is asked to keep.
"""

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any
from unittest import mock

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedspeech.edge_client.secure_sum_client import SecureUpload
from fedspeech.edge_client.secure_sum_device import DeviceRound
from fedspeech.protocol import secure_sum_maths, secure_sum_wire
from fedspeech.protocol.secure_sum_phases import Advert, SealedShares

SECURE_ATTACKS = ("random_shares", "silent_after_keys", "short_vector", "unbounded")
UNBOUNDED_FACTOR = -1000.0


def mount(attack: str, from_round: int) -> None:
    """Patch this process's device so that its secure-sum part mounts `attack` from round from_round on."""
    if attack not in SECURE_ATTACKS:
        raise ValueError(f"unknown attack {attack!r}, expected one of {', '.join(SECURE_ATTACKS)}")
    honest_share, honest_send = DeviceRound.share, SecureUpload.send
    honest_body, honest_change = secure_sum_wire.masked_body, secure_sum_maths.change_vector

    def share(
        self: DeviceRound, adverts: Sequence[Advert], identities: Mapping[str, Ed25519PublicKey]
    ) -> SealedShares:
        shares = honest_share(self, adverts, identities)
        if attack != "random_shares" or self.round < from_round:
            return shares
        return replace(shares, sealed={k: os.urandom(len(v)) for k, v in shares.sealed.items()})

    def short_body(masked: np.ndarray) -> bytes:
        return honest_body(masked)[:-4]

    def unbounded_change(trained: Any, received: Any, clip: float) -> tuple[np.ndarray, float]:
        change, _ = honest_change(trained, received, float("inf"))
        return UNBOUNDED_FACTOR * change, 0.0  # "within the clip", it says

    def send(self: SecureUpload, received: Any, trained: Any, tally: Any) -> int:
        if self.task.round < from_round or attack == "random_shares":
            return honest_send(self, received, trained, tally)
        if attack == "silent_after_keys":
            time.sleep(max(0.0, self.task.deadline - time.time()))  # keys agreed: nothing more is sent
            return 0
        if attack == "short_vector":
            with mock.patch.object(secure_sum_wire, "masked_body", short_body):
                return honest_send(self, received, trained, tally)
        with mock.patch.object(secure_sum_maths, "change_vector", unbounded_change):
            return honest_send(self, received, trained, tally)

    DeviceRound.share = share  # type: ignore[method-assign]
    SecureUpload.send = send  # type: ignore[method-assign]
