"""The secure-sum round mode through the round loop, with fake devices that speak its wire format to the
coordinator's SecureSumUploads in memory: no broker, no HTTP, no torch.
"""

import math
import os
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from scipy import stats

from fedspeech.coordinator.privacy.budget import epsilon_spent
from fedspeech.coordinator.privacy.secure_sum_uploads import SecureSumUploads
from fedspeech.coordinator.refusals import BadUpload, NotWanted
from fedspeech.coordinator.round.modes.secure_sum import device_noise, sum_bound
from fedspeech.coordinator.round.open_round import GRACE_MIN_S
from fedspeech.coordinator.strategies.differential_privacy import change_noise_multiplier, count_noise
from fedspeech.edge_client.secure_sum_device import DeviceRound, encode_change
from fedspeech.protocol import secure_sum_maths as ss
from fedspeech.protocol import secure_sum_wire as wire
from fedspeech.protocol import signing, weights
from fedspeech.protocol.bounds import DECISION_BINS
from fedspeech.protocol.messages import DeviceStatus, Task
from fedspeech.protocol.secure_tally import Tally, decode_tally, tally_length
from fedspeech.protocol.weights import Arrays
from tests.helpers.fake_fleet import FakeModel, Fleet, profile

pytestmark = pytest.mark.timeout(30)

BIG = 20_000  # weights of the model whose masked vectors are tested for uniformity


class BigModel(FakeModel):
    """The fake model with a second array large enough for a test of its bytes' distribution."""

    def initial(self, seed: int, depth: int | None = None) -> Arrays:
        return {"w": np.zeros(2, np.float32), "v": np.zeros(BIG, np.float32)}


class SecureDevice:
    """A device that takes part in secure sums with its trained weights at `value` (drop: the phase
    before which it goes silent), talking to its SecureSumUploads as the HTTP handlers would.
    """

    def __init__(
        self,
        fleet: Fleet,
        device_id: str,
        value: float,
        samples: int,
        drop: str = "",
        bounds: bool = True,
        step: tuple[float, ...] = (),
        random_shares: bool = False,
        short: bool = False,
    ) -> None:
        self.fleet, self.device_id, self.value, self.drop = fleet, device_id, value, drop
        self.step = step  # given: its trained weights are those received plus step, not `value`
        self.random_shares = random_shares  # True: the shares it hands out open for no one
        self.short = short  # True: its masked vector is sent 4 bytes short
        self.bounds = bounds  # False: its change is not scaled to the clip (a daemon patched to skip it)
        self.identity = Ed25519PrivateKey.generate()
        self.masked: list[bytes] = []  # what it sent in the masked phase
        # its clips per label, and its evaluation of the model it is sent: right a clips, b wrong as a
        decisions = np.zeros((2, DECISION_BINS), np.int64)
        right = samples // 2  # test clips: fewer than its training ones, as a device's split holds out
        decisions[0, -1] = right
        self.tally = Tally(np.array([samples, 2]), np.array([[right, 0], [1, 0]]), decisions, 0.5)
        self.errors: list[str] = []
        key = signing.public_key_text(self.identity)
        fleet.store.register_device(device_id, f"token-{device_id}", samples, {}, identity_key=key)
        fleet.link.statuses_[device_id] = DeviceStatus(device_id, "online", samples, profile(1.0))
        fleet.link.responders[device_id] = self.start

    def start(self, task: Task) -> None:
        self.fleet.uploads.acknowledge(self.device_id, task.task_id)  # as a daemon does on receipt
        received = {name: array.copy() for name, array in self.fleet.uploads.current.items()}
        threading.Thread(target=self.run, args=(task, received), daemon=True).start()

    def run(self, task: Task, received: Arrays) -> None:
        secure_uploads: SecureSumUploads = self.fleet.orchestrator.secure_uploads
        secure = task.secure_sum
        assert secure is not None
        device = DeviceRound(self.device_id, task.round, secure.threshold, self.identity)

        def post(phase: str, body: bytes) -> bool:
            if self.drop == phase:
                return False
            secure_uploads.take(self.device_id, task.round, phase, body)  # type: ignore[arg-type]
            return True

        def outcome(phase: str) -> bytes:
            while (reply := secure_uploads.outcome(self.device_id, task.round, phase)) is None:  # type: ignore[arg-type]
                time.sleep(0.002)
            return reply

        try:
            if not post("adverts", wire.advert_body(device.advert())):
                return
            adverts, identities = wire.read_adverts(outcome("adverts"), task.round)
            shares = device.share(adverts, identities)
            if self.random_shares:
                shares = replace(shares, sealed={k: os.urandom(len(v)) for k, v in shares.sealed.items()})
            if not post("shares", wire.shares_body(shares)):
                return
            sharers, sealed = wire.read_sharers(outcome("shares"))
            trained = {
                name: array + np.array(self.step, np.float32)
                if self.step
                else np.full_like(array, self.value)
                for name, array in received.items()
            }
            change, norm = ss.change_vector(trained, received, secure.clip if self.bounds else math.inf)
            encoded = np.concatenate(
                [encode_change(change, norm, secure, np.random.default_rng()), self.tally.encode()]
            )
            masked = wire.masked_body(device.masked(encoded, sharers))[: -4 if self.short else None]
            self.masked.append(masked)
            if not post("masked", masked):
                return
            survivors = wire.read_survivors(outcome("masked"))
            post("unmasking", wire.unmasking_body(device.unmask(survivors, sealed)))
        except (NotWanted, BadUpload) as exc:
            self.errors.append(str(exc))


def secure_fleet(tmp_path, model: FakeModel | None = None, **config) -> Fleet:
    settings = {"secure_aggregation": True, "round_timeout": 2.0, "secure_keys_timeout": 2.0}
    return Fleet(tmp_path, model, **{**settings, **config})


def test_a_secure_round_gives_fedavg_of_the_same_updates_within_the_fixed_points_error(tmp_path):
    values, samples = {"a": 1.0, "b": 2.0, "c": 4.0}, {"a": 10, "b": 20, "c": 40}
    fleet = secure_fleet(tmp_path / "secure", rounds=1, secure_norm_bound=50.0)
    for d in values:
        SecureDevice(fleet, d, values[d], samples[d])
    fleet.finish()
    plain = Fleet(tmp_path / "plain", rounds=1, round_timeout=2.0)
    for d in values:
        plain.device(d, value=values[d], samples=samples[d])
    plain.finish()
    secure_round, plain_round = fleet.store.rounds()[1], plain.store.rounds()[1]
    error = ss.FixedPoint(50.0, 3).max_error / (70 / 40)  # the sum's error, over the summed weights
    assert plain_round.accuracy == pytest.approx(3.0)  # (10 x 1 + 20 x 2 + 40 x 4) / 70
    assert abs(secure_round.accuracy - plain_round.accuracy) <= error
    assert secure_round.results == 3
    task = fleet.link.tasks_of(1)["a"]
    assert task.secure_sum is not None and task.secure_sum.threshold == 2 and task.secure_sum.devices == 3
    assert task.secure_sum.weight == pytest.approx(10 / 40)


def test_secure_rounds_give_fedavgs_models_round_by_round_from_the_same_changes(tmp_path):
    steps = {"a": (0.3, -0.1), "b": (0.2, 0.2), "c": (0.25, 0.05), "d": (0.1, 0.3)}
    samples = {"a": 10, "b": 20, "c": 40, "d": 30}
    secure = secure_fleet(tmp_path / "secure", rounds=4)
    for d in steps:
        SecureDevice(secure, d, 0.0, samples[d], step=steps[d])
    secure.finish()
    plain = Fleet(tmp_path / "plain", rounds=4, round_timeout=2.0)
    for d in steps:
        plain.device(d, value=0.0, samples=samples[d])
        plain.link.responders[d] = lambda task, d=d: plain.uploads.receive_update(
            task.round, d, body := trained_from(plain, task, steps[d], samples[d]), weights.sha256(body)
        )
    plain.finish()
    mean_step = sum(np.array(steps[d]) * samples[d] for d in steps) / sum(samples.values())
    error = ss.fixed_point(10.0, 0.0, 4).max_error / (100 / 40)  # the sum's rounding, over the weights
    for round in range(1, 5):
        secure_model, plain_model = (
            weights.decode(f.store.model_path(round, "weights").read_bytes())[0]["w"] for f in (secure, plain)
        )
        assert plain_model == pytest.approx(round * mean_step, abs=1e-6), "FedAvg by samples"
        assert np.abs(secure_model - plain_model).max() <= round * error + 1e-6, f"round {round}"


def trained_from(fleet: Fleet, task: Task, step: tuple[float, ...], samples: int) -> bytes:
    """A plain device's upload: the model its task carries, plus step."""
    received = weights.decode(fleet.store.model_path(task.round - 1, "weights").read_bytes())[0]
    trained = {"w": received["w"] + np.array(step, np.float32)}
    return weights.encode(trained, {"task_id": task.task_id, "num_samples": str(samples)})


def test_every_masked_vector_is_uniform_bytes_while_the_plain_update_is_not(tmp_path):
    fleet = secure_fleet(tmp_path, BigModel(), rounds=1)
    devices = [SecureDevice(fleet, d, 0.01 * (n + 1), 10) for n, d in enumerate("abc")]
    fleet.finish()
    for device in devices:
        (masked,) = device.masked
        counts = np.bincount(np.frombuffer(masked, np.uint8), minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-4, f"{device.device_id}'s masked vector is not uniform"
    plain = ss.FixedPoint(10.0, 3).encode(np.full(BIG + 2, 0.01)).tobytes()
    counts = np.bincount(np.frombuffer(plain, np.uint8), minlength=256)
    assert stats.chisquare(counts).pvalue < 1e-12


def test_a_device_gone_before_upload_is_masked_out_and_the_others_sum_is_right(tmp_path):
    fleet = secure_fleet(tmp_path, rounds=1, round_timeout=1.0)
    SecureDevice(fleet, "a", 1.0, 10)
    SecureDevice(fleet, "b", 3.0, 10)
    SecureDevice(fleet, "c", 100.0, 10, drop="masked")  # its keys agreed, its update never sent
    fleet.finish()
    record = fleet.store.rounds()[1]
    assert record.results == 2
    assert record.accuracy == pytest.approx(2.0, abs=1e-6)


@pytest.mark.parametrize("silent_at", ["shares", "masked"])
def test_a_device_silent_after_its_keys_costs_a_grace_not_the_timeout_and_sits_out_when_it_repeats(
    tmp_path, silent_at
):
    timeout = 20.0
    fleet = secure_fleet(tmp_path, rounds=3, round_timeout=timeout, secure_keys_timeout=timeout)
    for device, value in {"a": 1.0, "b": 3.0, "c": 5.0, "d": 7.0}.items():
        SecureDevice(fleet, device, value, 10)
    SecureDevice(fleet, "silent", 100.0, 10, drop=silent_at)
    started = time.time()
    fleet.finish(timeout=timeout)
    took = time.time() - started
    rounds = fleet.store.rounds()
    assert all(r.results == 4 for r in rounds[1:]), "every round completes with the other four"
    assert rounds[3].accuracy == pytest.approx(4.0, abs=1e-6), "the silent device's masks all removed"
    assert took < timeout, f"three rounds in {took:.1f} s: none waited its {timeout:g} s"
    assert "silent" in fleet.link.tasks_of(1) and "silent" in fleet.link.tasks_of(2)
    assert "silent" not in fleet.link.tasks_of(3), "silent twice in a row: it sits the next round out"


@pytest.mark.parametrize("attackers", [1, 2])
def test_random_shares_cost_a_round_nothing_and_their_senders_sit_out_when_they_repeat(tmp_path, attackers):
    timeout = 20.0
    fleet = secure_fleet(tmp_path, rounds=3, round_timeout=timeout, secure_keys_timeout=timeout)
    for device, value in {"a": 1.0, "b": 3.0, "c": 5.0, "d": 7.0}.items():
        SecureDevice(fleet, device, value, 10)
    for n in range(attackers):
        SecureDevice(fleet, f"x{n}", 100.0, 10, random_shares=True)
    started = time.time()
    fleet.finish(timeout=timeout)
    assert time.time() - started < timeout / 2
    rounds = fleet.store.rounds()
    assert [(r.results, r.accuracy) for r in rounds[1:]] == [(4, pytest.approx(4.0, abs=1e-6))] * 3
    assert "x0" in fleet.link.tasks_of(2) and "x0" not in fleet.link.tasks_of(3)


def test_a_masked_vector_refused_costs_the_round_no_grace(tmp_path):
    fleet = secure_fleet(tmp_path, rounds=1, round_timeout=20.0, secure_keys_timeout=20.0)
    for device, value in {"a": 1.0, "b": 3.0, "c": 5.0, "d": 7.0}.items():
        SecureDevice(fleet, device, value, 10)
    short = SecureDevice(fleet, "short", 100.0, 10, short=True)
    fleet.finish(timeout=20.0)
    record = fleet.store.rounds()[1]
    assert (record.results, record.accuracy) == (4, pytest.approx(4.0, abs=1e-6))
    assert record.wall_s < GRACE_MIN_S, "closed once the others were in, with no grace for the refused"
    assert short.errors and "a masked update of" in short.errors[0], "refused, with the reason"


def test_a_survivor_silent_at_the_unmasking_costs_a_grace_and_its_update_counts(tmp_path):
    timeout = 20.0
    fleet = secure_fleet(tmp_path, rounds=2, round_timeout=timeout, secure_keys_timeout=timeout)
    for device, value in {"a": 1.0, "b": 3.0, "c": 5.0, "d": 7.0}.items():
        SecureDevice(fleet, device, value, 10)
    SecureDevice(fleet, "silent", 4.0, 10, drop="unmasking")  # its masked update sent, its shares not
    started = time.time()
    fleet.finish(timeout=timeout)
    assert time.time() - started < timeout
    assert [(r.results, r.accuracy) for r in fleet.store.rounds()[1:]] == [(5, pytest.approx(4.0))] * 2


def test_a_sum_longer_than_bounded_changes_can_give_is_refused_and_its_device_found_and_sat_out(
    tmp_path, caplog
):
    fleet = secure_fleet(tmp_path, BigModel(), rounds=3, round_timeout=5.0)
    for device, value in {"a": 0.01, "b": 0.02, "c": 0.03}.items():
        SecureDevice(fleet, device, value, 10)
    # each weight at the fixed point's limit, 10: its change's norm 10 x sqrt(20,002), not 10
    SecureDevice(fleet, "cheat", -1000.0, 10, bounds=False)
    fleet.finish(timeout=30.0)
    assert caplog.text.count("a device did not bound its own") == 4, "with it, then a, b and c left out"
    assert "passed without cheat after sums with it were too long" in caplog.text
    rounds = fleet.store.rounds()
    assert [(r.round, r.results) for r in rounds[1:]] == [(1, 3), (2, 3), (3, 3)], "every round completes"
    assert rounds[3].accuracy == pytest.approx(0.02, abs=1e-6), "the honest three's mean, every round"
    assert "cheat" not in fleet.link.tasks_of(2) and "cheat" not in fleet.link.tasks_of(3)


def test_honest_changes_at_the_clip_with_noise_pass_the_sums_bound():
    bounds = [10.0] * 5
    rng = np.random.default_rng(0)
    length, noise = 20_000, 0.5
    fixed = ss.fixed_point(10.0, noise, 5)
    most = sum_bound(bounds, noise, length, fixed.max_error)
    aligned = np.full(length, 10.0 / math.sqrt(length)) * 5  # five changes at the clip, all alike
    noised = aligned + rng.normal(0, noise * math.sqrt(5), length)
    assert float(np.linalg.norm(noised)) <= most
    assert float(np.linalg.norm(aligned * 1.2)) > sum_bound(bounds, 0.0, length, fixed.max_error)


def test_too_few_left_to_unmask_and_the_round_is_not_aggregated(tmp_path):
    fleet = secure_fleet(tmp_path, rounds=1, secure_threshold=1.0, secure_keys_timeout=0.3)
    SecureDevice(fleet, "a", 1.0, 10)
    SecureDevice(fleet, "b", 3.0, 10)
    SecureDevice(fleet, "c", 5.0, 10, drop="unmasking")  # it uploads, then never gives up its shares
    with fleet.running():
        time.sleep(2.5)
    assert [r.round for r in fleet.store.rounds()] == [0], "no round is stored from a sum it cannot unmask"


def test_a_device_without_an_identity_key_is_left_out(tmp_path):
    fleet = secure_fleet(tmp_path, rounds=1, round_timeout=1.0)
    SecureDevice(fleet, "a", 1.0, 10)
    SecureDevice(fleet, "b", 3.0, 10)
    fleet.device("old", value=100.0)  # registered without a key: it would upload in the clear
    fleet.finish()
    assert "old" not in fleet.link.tasks_of(1)
    assert fleet.store.rounds()[1].accuracy == pytest.approx(2.0, abs=1e-6)


@pytest.mark.parametrize("strategy", ["median", "trimmed_mean", "krum", "quality", "hardware", "fedbuff"])
def test_a_strategy_that_needs_each_update_alone_is_refused_at_start(tmp_path, strategy):
    with pytest.raises(ValueError, match=f"the {strategy} strategy cannot run with secure aggregation"):
        secure_fleet(tmp_path, strategy=strategy)


def test_the_summing_strategies_run(tmp_path):
    for strategy in ("fedavg", "fedprox", "epochs_only", "random_k"):
        secure_fleet(tmp_path / strategy, strategy=strategy)


def test_dp_under_secure_aggregation_noises_the_sum_on_the_devices_and_divides_by_the_expected_count(
    tmp_path,
):
    z, delta = 0.5, 1e-5
    options = {"dp_noise_multiplier": z, "dp_norm_bound": 1.0, "dp_delta": delta}
    fleet = secure_fleet(tmp_path, BigModel(), rounds=1, **options)
    values = {"a": 0.001, "b": 0.002, "c": 0.003, "d": 0.004}  # changes of norm 0.14 to 0.57: not clipped
    for d, value in values.items():
        SecureDevice(fleet, d, value, 10 * (1 + ord(d) - ord("a")))  # samples that must not weigh
    fleet.finish()
    record = fleet.store.rounds()[1]
    assert record.dp_epsilon == pytest.approx(epsilon_spent(z, 1.0, 1, delta)) and record.dp_delta == delta
    secure = fleet.link.tasks_of(1)["a"].secure_sum
    assert secure is not None and secure.weight == 1.0 and secure.threshold == 2
    assert secure.noise == pytest.approx(device_noise(z, 1.0, 2, 4, BIG + 2))
    assert secure.noise == pytest.approx(z / np.sqrt(2), rel=1e-6)  # 2 devices' noise: z x clip at least
    new = weights.decode(fleet.store.model_path(1, "weights").read_bytes())[0]["v"].astype(np.float64)
    residual = new - sum(values.values()) / 4  # the expected count: all 4 sampled at rate 1
    assert abs(residual.mean()) < 4 * secure.noise / np.sqrt(BIG)  # unbiased
    # four devices' noise, each of deviation secure.noise, over the expected count of 4
    assert np.std(residual) == pytest.approx(secure.noise * 2 / 4, rel=0.05)


def test_adaptive_clipping_under_secure_aggregation_counts_the_changes_within_the_clip_with_noise(tmp_path):
    z, clip, target, rate = 0.01, 0.3, 0.9, 1.0
    options = {"dp_noise_multiplier": z, "dp_norm_bound": clip, "dp_norm_bound_quantile": target}
    options["dp_norm_bound_learning_rate"] = rate
    fleet = secure_fleet(tmp_path, BigModel(), rounds=2, **options)
    values = {"a": 0.001, "b": 0.002, "c": 0.003, "d": 0.004}  # changes of norm 0.14, 0.28, 0.42, 0.57
    for d, value in values.items():
        SecureDevice(fleet, d, value, 10)
    fleet.finish()
    first, second = fleet.link.tasks_of(1)["a"].secure_sum, fleet.link.tasks_of(2)["a"].secure_sum
    assert first is not None and second is not None
    deviation = count_noise(4, z)  # 4 / 20: the count's noise, as Andrew et al. set it
    changes = change_noise_multiplier(z, deviation)
    assert first.clip == clip and first.count_scale == pytest.approx(changes * clip / deviation)
    bound = ss.vector_bound(clip, first.count_scale)
    assert first.noise == pytest.approx(device_noise(z, bound, 2, 4, BIG + 3))
    # two of four within the clip: half, against the target's 0.9, so the clip grows by about e^0.4
    grown = np.log(second.clip / clip)
    assert abs(grown - rate * (target - 0.5)) < 5 * rate * deviation / 4, "the count's noise, 5 deviations"
    new = weights.decode(fleet.store.model_path(1, "weights").read_bytes())[0]["v"].astype(np.float64)
    clipped = (0.001 + 0.002 + 2 * clip / np.sqrt(BIG + 2)) / 4  # c's and d's changes cut to the clip
    assert abs(new.mean() - clipped) < 5 * first.noise * 2 / 4 / np.sqrt(BIG)  # 4 devices' noise, over 4
    record = fleet.store.rounds()[2]
    assert record.dp_epsilon == pytest.approx(epsilon_spent(z, 1.0, 2, 1e-5)), "the count costs no epsilon"


def test_a_tally_of_more_test_clips_than_the_devices_train_on_is_not_taken(tmp_path):
    fleet = secure_fleet(tmp_path, rounds=2)
    devices = [SecureDevice(fleet, d, 1.0, 40) for d in "abc"]
    liar = devices[2].tally  # all right, a million test clips: the fleet's accuracy would be 1.0000
    devices[2].tally = replace(liar, confusion=np.array([[10**6, 0], [0, 0]]))
    fleet.finish()
    assert [r.federated_accuracy for r in fleet.store.rounds()] == [None] * 3, "no figure from the lie"


def test_each_devices_noise_keeps_the_sum_private_once_the_threshold_survives():
    for z, clip, needed, devices, length in [(1.0, 1.0, 3, 6, 82_459), (0.3, 10.0, 50, 100, 10**6)]:
        noise = device_noise(z, clip, needed, devices, length)
        fixed = ss.fixed_point(clip, noise, devices)
        reach = clip + 0.5 * np.sqrt(length) / fixed.scale  # a device's clip and its rounding, at most
        assert noise * np.sqrt(needed) >= z * reach  # the sum's noise with only `needed` devices left
        assert noise * np.sqrt(needed) <= z * clip * 1.001  # and hardly more
    assert device_noise(0.0, 1.0, 2, 3, 100) == 0.0


def test_the_devices_counts_reach_the_coordinator_only_summed_as_the_fleets_and_its_evaluation(tmp_path):
    fleet = secure_fleet(tmp_path, rounds=2, secure_norm_bound=50.0)
    devices = [SecureDevice(fleet, d, 1.0, n) for d, n in (("a", 10), ("b", 20), ("c", 30))]
    fleet.finish()
    orchestrator = fleet.orchestrator
    assert orchestrator.fleet_counts == {"a": 60, "b": 6}  # the last round's three devices, summed
    # round 2's devices scored round 1's model: 30 of 33 clips right, as one sum of 3 devices
    first = fleet.store.rounds()[1]
    assert (first.evaluation_asked, first.evaluation_reports, first.evaluation_clips) == (3, 3, 33)
    assert first.federated_accuracy == pytest.approx(30 / 33)
    assert first.federated_loss == pytest.approx(1.5 / 33)
    assert fleet.store.device_evaluations(1) == [], "no device's own evaluation is stored"
    for device in devices:  # what each sent: its tally masked with the rest, uniform bytes
        tail = np.frombuffer(device.masked[-1], np.uint32)[-tally_length(2) :]
        assert not np.array_equal(decode_tally(tail, 2).train_counts, device.tally.train_counts)
