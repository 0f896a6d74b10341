"""Secure aggregation with real device processes over Mosquitto: the coordinator stores only sums; a
device killed while it trains is masked out of its round's sum, and devices killed once they uploaded
still count in it; under DP-FedAvg with adaptive clipping the clip moves by the devices' noised count of
changes within it.
"""

import signal

import numpy as np

from fedspeech.coordinator.strategies.differential_privacy import count_noise
from tests.helpers.coordinators import running_coordinator, wait_until_finished
from tests.helpers.devices import start_clients
from tests.helpers.waiting import wait_for

SPEAKERS = ["jackson", "nicolas", "theo", "george", "yweweler", "lucas"]


def test_secure_rounds_with_real_devices_store_no_update_of_one_device(
    tmp_path, mosquitto_url, topic_root, processes
):
    config = {
        "broker": mosquitto_url,
        "topic_root": topic_root,
        "rounds": 2,
        "min_devices": 3,
        "min_results": 2,
        "eval_every": 0,
        "secure_aggregation": True,
    }
    with running_coordinator(tmp_path, **config) as (service, url):
        clients = start_clients(processes, SPEAKERS[:3], url, mosquitto_url, topic_root, max_samples=24)
        wait_until_finished(service, clients)
        store = service.store
        length = sum(a.size for a in service.uploads.current.values() if a.dtype.kind == "f")
        for r in store.rounds()[1:]:
            assert r.results == 3 and r.accuracy is not None
            updates = store.updates(r.round)
            assert {u.device_id for u in updates} == set(SPEAKERS[:3])
            assert all(u.train_loss is None and u.sha256 == "" for u in updates), "nothing of one update"
            assert 3 * 4 * length < r.bytes_up < 3 * 4 * length * 1.05, "masked vectors and small messages"
        assert not list(store.dir.glob("**/*update*")), "no update is kept on disk"
        # no device's clips per label, in its status or its registration: the fleet's, summed
        statuses = service.link.statuses()
        for speaker in SPEAKERS[:3]:
            assert statuses[speaker].train_counts == statuses[speaker].test_counts == {}
            record = store.device(speaker)
            assert record is not None and record.test_counts == {}
        assert sum(service.orchestrator.fleet_counts.values()) == 3 * 24
        first = store.rounds()[1]  # evaluated by round 2's devices before they trained, as one sum
        assert first.evaluation_reports == 3 and first.federated_accuracy is not None
        assert store.device_evaluations(1) == []
    for speaker in SPEAKERS[:3]:
        log = (processes.log_dir / f"client-{speaker}.log").read_text()
        assert "round 2 done" in log, log[-2000:]


def test_two_devices_killed_after_their_upload_and_one_before_and_the_round_sums_the_five_uploads(
    tmp_path, mosquitto_url, topic_root, processes
):
    config = {
        "broker": mosquitto_url,
        "topic_root": topic_root,
        "rounds": 1,
        "min_devices": 6,
        "min_results": 2,
        "eval_every": 0,
        "round_timeout": 45.0,
        "secure_keys_timeout": 15.0,
        "secure_aggregation": True,
    }
    with running_coordinator(tmp_path, **config) as (service, url):
        clients = dict(
            zip(
                SPEAKERS,
                start_clients(processes, SPEAKERS, url, mosquitto_url, topic_root, max_samples=200),
                strict=True,
            )
        )
        secure_uploads = service.orchestrator.secure_uploads
        wait_for(lambda: secure_uploads.phase == "masked", 120, "the keys agreed and the devices training")
        clients["lucas"].send_signal(signal.SIGKILL)  # before its upload
        wait_for(lambda: {"jackson", "nicolas"} <= secure_uploads.answered, 60, "two devices' masked changes")
        for speaker in ("jackson", "nicolas"):  # after their upload, before they give up their shares
            clients[speaker].send_signal(signal.SIGKILL)
        wait_for(service.orchestrator.finished.is_set, 120, "the round, unmasked by the three left")
        (record,) = service.store.rounds()[1:]
        assert record.results == 5 and record.accuracy is not None
        assert {u.device_id for u in service.store.updates(1)} == set(SPEAKERS) - {"lucas"}


def test_adaptive_clipping_under_secure_aggregation_learns_from_the_devices_noised_count(
    tmp_path, mosquitto_url, topic_root, processes
):
    z, clip, target = 0.05, 1e-3, 0.5  # a clip far below any real change: none of them is within it
    config = {
        "broker": mosquitto_url,
        "topic_root": topic_root,
        "rounds": 1,
        "min_devices": 3,
        "min_results": 2,
        "eval_every": 0,
        "secure_aggregation": True,
        "dp_noise_multiplier": z,
        "dp_norm_bound": clip,
        "dp_norm_bound_quantile": target,
    }
    with running_coordinator(tmp_path, **config) as (service, url):
        clients = start_clients(processes, SPEAKERS[:3], url, mosquitto_url, topic_root, max_samples=24)
        wait_until_finished(service, clients)
        (record,) = service.store.rounds()[1:]
        assert record.results == 3
        strategy = service.orchestrator.strategy
        strategy.configure_round(2, dict.fromkeys(SPEAKERS[:3]), np.random.default_rng(0))
    # none of 3 within the clip, counted with noise of deviation 3 / 20 (over 3 expected): the clip
    # steps by about e^(0.2 x 0.5)
    deviation = count_noise(3, z) / 3
    grown = np.log(strategy.clip / clip)
    assert abs(grown - 0.2 * target) < 5 * 0.2 * deviation, f"the clip went from {clip} to {strategy.clip}"
