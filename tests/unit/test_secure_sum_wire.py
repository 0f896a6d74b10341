"""A secure sum's messages on the wire: what a device sends reads back as it was, anything else is a
ProtocolError that says why; the change vector and its inverse.
"""

import json

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.edge_client.secure_sum_device import DeviceRound
from fedspeech.protocol import messages, signing
from fedspeech.protocol import secure_sum_maths as ss
from fedspeech.protocol import secure_sum_wire as wire
from fedspeech.protocol.bounds import DECISION_BINS, ProtocolError
from fedspeech.protocol.message_checks import MAX_SECURE_DEVICES
from fedspeech.protocol.messages import Profile, Registration, SecureSum
from fedspeech.protocol.secure_tally import TALLY_MAX, Tally, decode_tally


def test_an_advert_reads_back_as_it_was_signed():
    key = Ed25519PrivateKey.generate()
    advert = DeviceRound("kitchen", 3, 2, key).advert()
    assert wire.read_advert(wire.advert_body(advert), "kitchen", 3) == advert
    body = wire.adverts_body([advert], {"kitchen": signing.public_key_text(key)})
    adverts, identities = wire.read_adverts(body, 3)
    assert adverts == [advert] and {d: signing.public_key_text(k) for d, k in identities.items()} == {
        "kitchen": signing.public_key_text(key)
    }


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"[]", "not a JSON object"),
        (b"{", "not JSON"),
        (b'{"share_key": 5}', "share_key: not 32 bytes"),
        (json.dumps({"share_key": "AAAA"}).encode(), "share_key: 3 bytes, not 32"),
        (json.dumps({"share_key": "!" * 44}).encode(), "bad base64"),
        (b" " * (wire.MAX_BODY_BYTES + 1), "exceeds"),
    ],
)
def test_a_bad_advert_is_refused_with_its_reason(body, reason):
    with pytest.raises(ProtocolError, match=reason):
        wire.read_advert(body, "kitchen", 3)


def test_share_maps_and_device_lists_are_bounded_and_checked():
    too_many = {f"d{n}": "A" * 124 for n in range(256)}
    with pytest.raises(ProtocolError, match="at most 255"):
        wire.read_shares(json.dumps({"sealed": too_many}).encode(), "kitchen", 1)
    with pytest.raises(ProtocolError, match="not a device id"):
        wire.read_survivors(json.dumps({"survivors": ["../etc"]}).encode())
    with pytest.raises(ProtocolError, match="not 64"):
        wire.read_masked(bytes(60), 16)
    masked = np.arange(16, dtype=np.uint32) * 2**28
    assert (wire.read_masked(wire.masked_body(masked), 16) == masked).all()


def test_a_change_is_clipped_in_norm_and_laid_back_onto_the_model_it_came_from():
    received = {"a": np.zeros((2, 2), np.float32), "b": np.ones(3, np.float32), "n": np.array([7])}
    trained = {"a": np.full((2, 2), 3.0, np.float32), "b": np.full(3, 5.0, np.float32), "n": np.array([9])}
    change, norm = ss.change_vector(trained, received, clip=100.0)
    assert norm == pytest.approx(np.sqrt(4 * 9 + 3 * 16)) and len(change) == 7, (
        "the integer array is left out"
    )
    back = ss.with_change(received, change)
    assert np.allclose(back["a"], 3.0) and np.allclose(back["b"], 5.0) and back["n"][0] == 7
    clipped, _ = ss.change_vector(trained, received, clip=1.0)
    assert np.linalg.norm(clipped) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="does not match"):
        ss.change_vector({"a": trained["a"]}, received, 1.0)


@pytest.mark.parametrize(
    ("secure", "reason"),
    [
        (SecureSum(1, 3, 1.0, 1.0, 10.0), "threshold"),
        (SecureSum(4, 3, 1.0, 1.0, 10.0), "threshold"),
        (SecureSum(2, 300, 1.0, 1.0, 10.0), "threshold"),
        (SecureSum(2, 3, float("inf"), 1.0, 10.0), "clip"),
        (SecureSum(2, 3, 1.0, 1.5, 10.0), "weight"),
        (SecureSum(2, 3, 1.0, 1.0, 0.0), "unmasking time"),
        (SecureSum(2, 3, 1.0, 1.0, 10.0, -0.1), "noise"),
        (SecureSum(2, 3, 1.0, 1.0, 10.0, float("nan")), "noise"),
    ],
)
def test_a_task_s_secure_sum_settings_are_bounded(secure, reason):
    from fedspeech.protocol.message_checks import check_secure_sum

    with pytest.raises(ProtocolError, match=reason):
        check_secure_sum(secure)


def test_a_registration_s_identity_key_must_be_an_ed25519_key():
    profile = Profile(1, 1000.0, 512.0)
    key = signing.public_key_text(Ed25519PrivateKey.generate())
    good = messages.encode(Registration("kitchen", 10, profile, {}, key))
    assert messages.decode(good, Registration).identity_key == key
    bad = messages.encode(Registration("kitchen", 10, profile, {}, "bm90IGEga2V5"))
    with pytest.raises(ProtocolError, match="identity_key"):
        messages.decode(bad, Registration)


def test_a_tally_sums_exactly_and_each_count_is_bounded_so_the_sum_never_wraps():
    decisions = np.arange(2 * DECISION_BINS).reshape(2, DECISION_BINS)
    one = Tally(np.array([3, 0, 5]), np.arange(9).reshape(3, 3), decisions, 12.3456)
    two = Tally(np.array([1, 7, 0]), np.ones((3, 3), np.int64), decisions, 0.5)
    total = decode_tally(one.encode() + two.encode(), 3)  # summed modulo 2^32, as the secure sum does
    assert total.train_counts.tolist() == [4, 7, 5]
    assert np.array_equal(total.confusion, np.arange(9).reshape(3, 3) + 1)
    assert np.array_equal(total.decisions, 2 * decisions)
    assert total.loss_sum == pytest.approx(12.846)
    liar = Tally(np.array([10**12, -5, 0]), np.zeros((3, 3)), decisions, float("inf")).encode()
    assert liar[:3].tolist() == [TALLY_MAX, 0, 0] and liar[-1] == TALLY_MAX
    summed = np.zeros(len(liar), np.uint64)
    for _ in range(MAX_SECURE_DEVICES):
        summed += liar
    assert summed.max() < 2**32, "the most devices of a round, every count at its bound, do not wrap"
    with pytest.raises(ValueError, match="numbers"):
        decode_tally(liar[:-1], 3)
