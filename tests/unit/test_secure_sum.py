"""Secure aggregation's arithmetic: fixed point, masks that cancel, dropouts, Shamir shares; no network."""

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from scipy.stats import chisquare

from fedspeech.protocol.secure_sum_maths import (
    FixedPoint,
    combine_secret,
    expand,
    mask,
    new_seed,
    open_share,
    pair_seed,
    rebuild_checked,
    seal_share,
    split_secret,
    unmask,
)

LENGTH = 5000


class Device:
    """One device of a round: an update, a self seed and an X25519 key."""

    def __init__(self, device_id: str, rng: np.random.Generator, clip: float = 1.0):
        self.id = device_id
        self.update = rng.normal(0, clip / 4, LENGTH)
        self.seed = new_seed()
        self.key = X25519PrivateKey.generate()

    def seeds_with(self, others: list["Device"], context: bytes) -> dict[str, bytes]:
        return {o.id: pair_seed(self.key, o.key.public_key(), context + pair(self, o)) for o in others}


def pair(a: Device, b: Device) -> bytes:
    return "|".join(sorted([a.id, b.id])).encode()


def others(devices: list[Device], device: Device) -> list[Device]:
    return [o for o in devices if o is not device]


def fleet(count: int, seed: int = 0) -> list[Device]:
    rng = np.random.default_rng(seed)
    return [Device(f"dev-{n:02d}", rng) for n in range(count)]


def masked_vectors(devices: list[Device], coding: FixedPoint) -> dict[str, np.ndarray]:
    """Every device's masked update, masks agreed with all the others."""
    return {
        d.id: mask(
            coding.encode(d.update), d.id, d.seed, d.seeds_with([o for o in devices if o is not d], b"r1")
        )
        for d in devices
    }


def test_fixed_point_sums_within_its_bound_and_never_wraps():
    coding = FixedPoint(clip=1.0, devices=6)
    devices = fleet(6)
    total = sum((coding.encode(d.update) for d in devices), start=np.zeros(LENGTH, np.uint32))
    exact = np.sum([np.clip(d.update, -1, 1) for d in devices], axis=0)
    error = np.abs(coding.decode(total) - exact).max()
    assert 0 < error <= coding.max_error
    # six updates all at the clip, of either sign, sum without wrapping round
    for sign in (1, -1):
        extreme = sum((coding.encode(np.full(3, sign * 5.0)) for _ in range(6)), start=np.zeros(3, np.uint32))
        assert coding.decode(extreme) == pytest.approx(np.full(3, sign * 6.0), abs=coding.max_error)


def test_masks_cancel_in_the_sum_exactly():
    coding = FixedPoint(clip=1.0, devices=5)
    devices = fleet(5)
    masked = masked_vectors(devices, coding)
    total = sum(masked.values(), start=np.zeros(LENGTH, np.uint32))
    plain = unmask(total, [d.seed for d in devices], [])
    expected = sum((coding.encode(d.update) for d in devices), start=np.zeros(LENGTH, np.uint32))
    assert np.array_equal(plain, expected)
    # without the self masks taken away, it is not the sum
    assert not np.array_equal(total, expected)


def test_devices_that_drop_after_agreeing_are_unmasked_from_their_rebuilt_keys():
    coding = FixedPoint(clip=1.0, devices=6)
    devices = fleet(6, seed=1)
    masked = masked_vectors(devices, coding)
    survivors, dropped = devices[:4], devices[4:]
    threshold = 4
    total = sum((masked[d.id] for d in survivors), start=np.zeros(LENGTH, np.uint32))
    pairs = []
    for gone in dropped:
        shares = split_secret(gone.key.private_bytes_raw(), threshold, len(devices))
        held = {n: shares[n] for n in range(len(survivors))}  # the survivors hold the first four shares
        rebuilt = X25519PrivateKey.from_private_bytes(combine_secret(held, threshold))
        assert rebuilt.public_key().public_bytes_raw() == gone.key.public_key().public_bytes_raw()
        for s in survivors:
            pairs.append((s.id, gone.id, pair_seed(rebuilt, s.key.public_key(), b"r1" + pair(s, gone))))
    plain = unmask(total, [s.seed for s in survivors], pairs)
    expected = sum((coding.encode(d.update) for d in survivors), start=np.zeros(LENGTH, np.uint32))
    assert np.array_equal(plain, expected)
    assert coding.decode(plain) == pytest.approx(
        np.sum([d.update for d in survivors], axis=0), abs=coding.max_error
    )


def byte_uniformity(vector: np.ndarray) -> float:
    """The chi-square test's p-value for the vector's bytes being uniform over 0-255."""
    counts = np.bincount(np.asarray(vector, dtype="<u4").view(np.uint8), minlength=256)
    return float(chisquare(counts).pvalue)


def test_one_masked_update_is_uniform_bytes_and_the_plain_one_is_not():
    coding = FixedPoint(clip=1.0, devices=6)
    devices = fleet(6, seed=2)
    masked = masked_vectors(devices, coding)
    for d in devices:  # fresh keys each run: a p-value of uniform bytes is itself uniform, so the bar is low
        assert byte_uniformity(masked[d.id]) > 1e-6, d.id
        assert byte_uniformity(coding.encode(d.update)) < 1e-10, d.id


def test_any_threshold_of_the_shares_rebuild_a_secret_and_fewer_do_not():
    secret = new_seed()
    shares = split_secret(secret, 3, 5)
    assert len(shares) == 5 and len({len(s) for s in shares}) == 1
    for chosen in ([0, 1, 2], [0, 2, 4], [1, 3, 4], [2, 3, 4]):
        assert combine_secret({n: shares[n] for n in chosen}, 3) == secret
    with pytest.raises(ValueError, match="2 shares cannot rebuild"):
        combine_secret({0: shares[0], 1: shares[1]}, 3)
    wrong = {0: shares[0], 1: shares[1], 2: bytes(len(shares[2]))}
    assert combine_secret(wrong, 3) != secret  # a wrong share is caught by the caller's check, not here


def test_pair_seeds_agree_both_ways_and_depend_on_the_context():
    a, b = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    ab = pair_seed(a, b.public_key(), b"round 1")
    assert ab == pair_seed(b, a.public_key(), b"round 1")
    assert ab != pair_seed(a, b.public_key(), b"round 2")
    assert not np.array_equal(expand(ab, 8), expand(pair_seed(a, b.public_key(), b"round 2"), 8))


def test_a_sealed_share_opens_for_its_receiver_in_its_round_only():
    sender, receiver, outsider = (X25519PrivateKey.generate() for _ in range(3))
    sealed = seal_share(sender, receiver.public_key(), b"round 3|a|b", b"share bytes")
    assert open_share(receiver, sender.public_key(), b"round 3|a|b", sealed) == b"share bytes"
    assert b"share bytes" not in sealed
    refusals = [
        (receiver, b"round 4|a|b", sealed),  # replayed into another round
        (outsider, b"round 3|a|b", sealed),  # the coordinator, or a third device
        (receiver, b"round 3|a|b", sealed[:-1] + bytes([sealed[-1] ^ 1])),  # altered
        (receiver, b"round 3|a|b", sealed[:20]),  # cut short
    ]
    for key, context, payload in refusals:
        with pytest.raises(ValueError, match="sealed share"):
            open_share(key, sender.public_key(), context, payload)


def test_a_wrong_share_is_found_and_the_secret_still_rebuilt():
    key = X25519PrivateKey.generate()
    published = key.public_key().public_bytes_raw()

    def matches(secret: bytes) -> bool:
        return X25519PrivateKey.from_private_bytes(secret).public_key().public_bytes_raw() == published

    shares = dict(enumerate(split_secret(key.private_bytes_raw(), 3, 6)))
    shares[1] = bytes(32)  # a device that lies about the share it holds
    secret, wrong = rebuild_checked(shares, 3, matches)
    assert secret == key.private_bytes_raw()
    assert wrong == {1}
    # among many holders, two wrong shares early in the order are found too
    many = dict(enumerate(split_secret(key.private_bytes_raw(), 11, 20)))
    many[1] = many[4] = bytes(32)
    assert rebuild_checked(many, 11, matches) == (key.private_bytes_raw(), {1, 4})
    # too many liars to tell: refused, never a wrong secret
    for liar in (0, 2, 3, 4):
        shares[liar] = bytes(32)
    with pytest.raises(ValueError, match="no 3 of the 6 shares"):
        rebuild_checked(shares, 3, matches)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: FixedPoint(clip=0.0, devices=3), "clip must be positive"),
        (lambda: FixedPoint(clip=1.0, devices=0), "devices must be between"),
        (lambda: expand(b"short", 4), "a seed has 32 bytes"),
        (lambda: split_secret(b"x" * 20, 2, 3), "multiple of 16"),
        (lambda: split_secret(b"x" * 16, 4, 3), "threshold <= holders"),
        (lambda: combine_secret({0: b"x" * 16, 1: b"y" * 32}, 2), "one length"),
    ],
)
def test_bad_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
