"""A secure-sum round in memory, devices and coordinator through their phase methods: exact sums with
and without dropouts, and every misbehaviour refused with a reason; no network.
"""

from dataclasses import replace

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.coordinator.privacy.secure_sum_server import Refused, ServerRound
from fedspeech.edge_client.secure_sum_device import DeviceRound
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.secure_sum_maths import FixedPoint

ROUND, LENGTH = 7, 3000


class Fleet:
    """Devices with identity keys, their updates, and the coordinator's side of one round."""

    def __init__(self, count: int, threshold: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.ids = [f"dev-{n}" for n in range(count)]
        identities = {d: Ed25519PrivateKey.generate() for d in self.ids}
        self.public = {d: key.public_key() for d, key in identities.items()}
        self.devices = {d: DeviceRound(d, ROUND, threshold, identities[d]) for d in self.ids}
        self.updates = {d: rng.normal(0, 0.05, LENGTH) for d in self.ids}
        self.coding = FixedPoint(clip=1.0, devices=count)
        self.server = ServerRound(ROUND, threshold, LENGTH, self.public)

    def advertise(self, devices: list[str]) -> None:
        for d in devices:
            self.server.take_advert(self.devices[d].advert())

    def share(self, devices: list[str]) -> None:
        adverts = self.server.adverts()
        for d in devices:
            self.server.take_shares(self.devices[d].share(adverts, self.public))

    def upload(self, devices: list[str]) -> None:
        sharers = self.server.sharers()
        for d in devices:
            encoded = self.coding.encode(self.updates[d])
            self.server.take_masked(d, self.devices[d].masked(encoded, sharers))

    def unmask(self, devices: list[str]) -> None:
        survivors = self.server.survivors()
        for d in devices:
            self.server.take_unmasking(self.devices[d].unmask(survivors, self.server.shares_for(d)))

    def expected(self, devices: list[str]) -> np.ndarray:
        return sum((self.coding.encode(self.updates[d]) for d in devices), start=np.zeros(LENGTH, np.uint32))


def test_the_coordinator_gets_the_exact_sum_and_fedavg_within_the_fixed_point_error():
    fleet = Fleet(6, threshold=4)
    everyone = fleet.ids
    fleet.advertise(everyone)
    fleet.share(everyone)
    fleet.upload(everyone)
    fleet.unmask(everyone)
    total, liars, left_out = fleet.server.total()
    assert liars == set() and left_out == {}
    assert np.array_equal(total, fleet.expected(everyone))
    mean = fleet.coding.decode(total) / 6
    error = np.abs(mean - np.mean([fleet.updates[d] for d in everyone], axis=0)).max()
    assert 0 < error <= fleet.coding.max_error / 6


def test_one_dropped_before_upload_and_two_after_the_sum_of_the_others_survives():
    fleet = Fleet(6, threshold=3)
    everyone = fleet.ids
    fleet.advertise(everyone)
    fleet.share(everyone)
    uploaded = everyone[1:]  # dev-0 dies before its upload
    fleet.upload(uploaded)
    fleet.unmask(uploaded[2:])  # dev-1 and dev-2 die after theirs: three answer
    total, _, _ = fleet.server.total()
    assert np.array_equal(total, fleet.expected(uploaded))


def test_too_few_left_to_unmask_fails_the_round_rather_than_give_a_wrong_sum():
    fleet = Fleet(6, threshold=4)
    everyone = fleet.ids
    fleet.advertise(everyone)
    fleet.share(everyone)
    fleet.upload(everyone[1:])
    fleet.unmask(everyone[3:])  # three answers for a threshold of four
    with pytest.raises(ProtocolError, match="fewer than the 4"):
        fleet.server.total()


def test_a_wrong_share_is_named_and_the_sum_still_right():
    fleet = Fleet(6, threshold=3)
    everyone = fleet.ids
    fleet.advertise(everyone)
    fleet.share(everyone)
    fleet.upload(everyone[:5])
    survivors = fleet.server.survivors()
    for d in everyone[:5]:
        reply = fleet.devices[d].unmask(survivors, fleet.server.shares_for(d))
        if d == "dev-2":  # lies about every share it holds
            reply = replace(
                reply,
                seed_shares={k: bytes(32) for k in reply.seed_shares},
                key_shares={k: bytes(32) for k in reply.key_shares},
            )
        fleet.server.take_unmasking(reply)
    total, liars, _ = fleet.server.total()
    assert liars == {"dev-2"}
    assert np.array_equal(total, fleet.expected(everyone[:5]))


def random_shares(fleet: Fleet, device: str, to: list[str] | None = None) -> None:
    """device hands out sealed shares of the right length that open for no one (or for none of `to`)."""
    shares = fleet.devices[device].share(fleet.server.adverts(), fleet.public)
    rng = np.random.default_rng(1)
    sealed = {k: rng.bytes(len(v)) if to is None or k in to else v for k, v in shares.sealed.items()}
    fleet.server.take_shares(replace(shares, sealed=sealed))


@pytest.mark.parametrize("attackers", [["dev-5"], ["dev-4", "dev-5"]])
def test_random_shares_leave_their_sender_out_named_and_the_others_sum_right(attackers):
    fleet = Fleet(6, threshold=3)
    everyone = fleet.ids
    fleet.advertise(everyone)
    honest = [d for d in everyone if d not in attackers]
    fleet.share(honest)
    for attacker in attackers:
        random_shares(fleet, attacker)
    fleet.upload(everyone)
    fleet.unmask(everyone)
    total, liars, left_out = fleet.server.total()
    assert np.array_equal(total, fleet.expected(honest)), "the others' exact sum"
    assert set(left_out) == set(attackers)
    for attacker in attackers:
        assert set(left_out[attacker]) == set(everyone) - {attacker}, "named by every other device"
    assert not liars & set(honest), "no honest device blamed"


def test_a_device_whose_shares_were_spoiled_on_their_way_gives_pair_seeds_only_while_enough_opened():
    fleet = Fleet(6, threshold=3)
    fleet.advertise(fleet.ids)
    fleet.share(fleet.ids)
    fleet.upload(fleet.ids)
    survivors, device = fleet.server.survivors(), fleet.devices["dev-0"]
    spoiled = dict(fleet.server.shares_for("dev-0"))
    for sender in ("dev-1", "dev-2"):  # three others' shares still open: each keeps its pair mask secret
        spoiled[sender] = bytes(len(spoiled[sender]))
    reply = device.unmask(survivors, spoiled)
    assert set(reply.pair_seeds) == {"dev-1", "dev-2"} and set(reply.seed_shares) == set(survivors) - {
        "dev-1",
        "dev-2",
    }
    every = {sender: bytes(len(sealed)) for sender, sealed in fleet.server.shares_for("dev-3").items()}
    with pytest.raises(ProtocolError, match="too few to give pair seeds"):  # all spoiled: it would expose
        fleet.devices["dev-3"].unmask(survivors, every)


def test_shares_that_do_not_open_for_one_device_cost_nothing_when_the_others_rebuild_them():
    fleet = Fleet(6, threshold=3)
    everyone = fleet.ids
    fleet.advertise(everyone)
    fleet.share(everyone[:5])
    random_shares(fleet, "dev-5", to=["dev-0"])  # dev-0 alone cannot open its share
    fleet.upload(everyone)
    fleet.unmask(everyone)
    total, _, left_out = fleet.server.total()
    assert left_out == {} and np.array_equal(total, fleet.expected(everyone))


def test_random_shares_from_a_device_that_then_drops_out_leave_the_sum_of_the_others():
    fleet = Fleet(6, threshold=3)
    everyone = fleet.ids
    fleet.advertise(everyone)
    fleet.share(everyone[:5])
    random_shares(fleet, "dev-5")
    fleet.upload(everyone[:5])  # dev-5 never uploads: its mask key's shares open for no one
    fleet.unmask(everyone[:5])
    total, _, left_out = fleet.server.total()
    assert left_out == {} and np.array_equal(total, fleet.expected(everyone[:5]))


def test_the_coordinator_refuses_what_does_not_count():
    fleet = Fleet(4, threshold=3)
    server, devices = fleet.server, fleet.devices
    advert = devices["dev-0"].advert()
    stranger = DeviceRound("dev-0", ROUND, 3, Ed25519PrivateKey.generate()).advert()
    with pytest.raises(ProtocolError, match="not signed by its device"):
        server.take_advert(stranger)
    with pytest.raises(ProtocolError, match="for round 6, not 7"):
        server.take_advert(replace(advert, round=6))
    with pytest.raises(Refused, match="not in this round"):
        server.take_advert(replace(advert, device_id="dev-9"))
    fleet.advertise(fleet.ids)
    with pytest.raises(Refused, match="second advert"):
        server.take_advert(advert)
    adverts = server.adverts()
    shares = devices["dev-0"].share(adverts, fleet.public)
    with pytest.raises(Refused, match="not one for each other"):
        server.take_shares(replace(shares, sealed={k: v for k, v in shares.sealed.items() if k != "dev-1"}))
    with pytest.raises(Refused, match="is not 92 bytes"):
        server.take_shares(replace(shares, sealed={k: v + b"x" for k, v in shares.sealed.items()}))
    fleet.share(fleet.ids)
    with pytest.raises(Refused, match="second set of shares"):
        server.take_shares(shares)
    sharers = server.sharers()
    masked = devices["dev-0"].masked(fleet.coding.encode(fleet.updates["dev-0"]), sharers)
    with pytest.raises(Refused, match="not 3000 uint32"):
        server.take_masked("dev-0", masked[:-1])
    with pytest.raises(Refused, match="not 3000 uint32"):
        server.take_masked("dev-0", masked.astype(np.int64))
    with pytest.raises(Refused, match="shared no keys"):
        server.take_masked("dev-9", masked)
    server.take_masked("dev-0", masked)
    with pytest.raises(Refused, match="second masked update"):
        server.take_masked("dev-0", masked)
    fleet.upload(fleet.ids[1:])
    reply = devices["dev-1"].unmask(server.survivors(), server.shares_for("dev-1"))
    both = replace(reply, key_shares={"dev-0": reply.seed_shares["dev-0"]})  # a seed's and a key's share
    with pytest.raises(Refused, match="one share or pair seed of each it must"):
        server.take_unmasking(both)
    doubled = replace(reply, pair_seeds={"dev-0": bytes(32)})  # dev-0's seed share and a pair seed with it
    with pytest.raises(Refused, match="one share or pair seed of each it must"):
        server.take_unmasking(doubled)
    itself = replace(reply, pair_seeds={"dev-1": bytes(32)})
    with pytest.raises(Refused, match="one share or pair seed of each it must"):
        server.take_unmasking(itself)
    server.take_unmasking(reply)
    with pytest.raises(Refused, match="second unmasking"):
        server.take_unmasking(reply)


def test_a_device_refuses_what_would_expose_its_update():
    fleet = Fleet(4, threshold=3)
    server, device = fleet.server, fleet.devices["dev-0"]
    fleet.advertise(fleet.ids)
    adverts = server.adverts()
    with pytest.raises(ProtocolError, match="fewer than the 3"):
        device.share(adverts[:2], fleet.public)
    # the coordinator puts in keys of its own under another device's name
    swapped = [replace(a, mask_key=bytes(32)) if a.device_id == "dev-1" else a for a in adverts]
    with pytest.raises(ProtocolError, match="the advert of dev-1 is not signed by its device"):
        device.share(swapped, fleet.public)
    fleet.share(fleet.ids)
    sharers = server.sharers()
    encoded = fleet.coding.encode(fleet.updates["dev-0"])
    with pytest.raises(ProtocolError, match="this one among them"):
        device.masked(encoded, sharers[1:])
    fleet.upload(fleet.ids)
    survivors = server.survivors()
    # asked with a survivor list that leaves out two sharers: it would give up their mask keys
    with pytest.raises(ProtocolError, match="fewer than the 3"):
        device.unmask(survivors[:2], server.shares_for("dev-0"))
    tampered = dict(server.shares_for("dev-0"))
    tampered["dev-1"] = tampered["dev-1"][:-1] + bytes([tampered["dev-1"][-1] ^ 1])
    # a share that does not open, where only two others' did (threshold 3): two colluders could hold
    # every other pair mask of dev-0, so it gives no pair seed and drops out
    with pytest.raises(ProtocolError, match="of only 2 did: too few"):
        device.unmask(survivors, tampered)
    device.unmask(survivors, server.shares_for("dev-0"))
    with pytest.raises(ProtocolError, match="already given up its shares"):
        device.unmask(survivors, server.shares_for("dev-0"))
