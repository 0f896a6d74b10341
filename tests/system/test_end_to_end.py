"""Coordinator and real device processes training FSDD over a real broker, Mosquitto and the embedded one."""

import json
import shutil
import signal
import threading

import paho.mqtt.client as mqtt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedspeech.models.clips.datasets import client_clips, load_corpus
from fedspeech.protocol import messages, signing, weights
from fedspeech.protocol.messages import ModelAnnouncement
from fedspeech.protocol.topics import Topics, parse_broker_url
from tests.helpers.coordinators import running_coordinator, wait_until_finished
from tests.helpers.devices import start_clients
from tests.helpers.ports import free_port
from tests.helpers.waiting import get_json, wait_for

SPEAKERS = ["jackson", "nicolas", "theo"]
ROUNDS = 2


def _retained_model(broker_url: str, topic_root: str, key: Ed25519PublicKey) -> ModelAnnouncement:
    """The retained model announcement, its signature checked with the coordinator's key."""
    host, port = parse_broker_url(broker_url)
    got = threading.Event()
    box = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.on_connect = lambda c, *_: c.subscribe(Topics(topic_root).model, qos=1)
    client.message_callback_add(Topics(topic_root).model, lambda c, u, m: (box.append(m), got.set()))
    client.connect(host, port)
    client.loop_start()
    try:
        assert got.wait(10), "no retained model announcement"
    finally:
        client.loop_stop()
        client.disconnect()
    assert box[0].retain
    return messages.decode(signing.verify(key, box[0].topic, box[0].payload), ModelAnnouncement)


@pytest.mark.parametrize("broker", ["mosquitto", "embedded"])
def test_rounds_over_a_real_broker(broker, request, tmp_path, topic_root, processes):
    broker_url = request.getfixturevalue("mosquitto_url") if broker == "mosquitto" else None
    # the coordinator's own held-out folder: exactly the devices' test clips, in DIR/<label>/
    corpus = load_corpus("fsdd")
    heldout = tmp_path / "heldout"
    for clip in (clip for speaker in SPEAKERS for clip in client_clips(corpus, speaker)[1]):
        (heldout / corpus.labels[clip.label]).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(clip.path, heldout / corpus.labels[clip.label] / clip.path.name)
    config = {
        "eval_data": heldout,
        "eval_corpus": None,
        "broker": broker_url,
        "broker_port": free_port(),
        "topic_root": topic_root,
        "rounds": ROUNDS,
        "min_devices": len(SPEAKERS),
        "min_results": len(SPEAKERS),
    }
    with running_coordinator(tmp_path, **config) as (service, url):
        clients = start_clients(processes, SPEAKERS, url, service.broker_url, topic_root, max_samples=40)
        wait_until_finished(service, clients)

        rounds = service.store.rounds()
        assert [r.round for r in rounds] == list(range(ROUNDS + 1))
        assert len({r.weights_sha256 for r in rounds}) == ROUNDS + 1, "the global model changes every round"
        for r in rounds[1:]:
            size = service.store.model_path(r.round - 1, "weights").stat().st_size  # what the round trains
            updates = service.store.updates(r.round)
            assert r.devices == r.results == len(updates) == len(SPEAKERS)
            assert sorted(u.device_id for u in updates) == SPEAKERS
            assert all(u.num_samples == 40 for u in updates)
            assert 0.0 <= r.accuracy <= 1.0 and 0.0 <= r.macro_f1 <= 1.0 and r.loss > 0
            # the held-out folder is the union of the devices' test splits: pooling their counts must give
            # the coordinator's own figures
            assert r.evaluation_asked == r.evaluation_reports == len(SPEAKERS)
            assert r.federated_accuracy == pytest.approx(r.accuracy, abs=1 / 150)
            assert r.federated_loss == pytest.approx(r.loss, rel=1e-3)
            assert r.bytes_up >= len(SPEAKERS) * size * 0.9
            assert r.bytes_down >= len(SPEAKERS) * size
            stored = service.store.model_path(r.round, "weights").read_bytes()
            assert weights.sha256(stored) == r.weights_sha256
            assert service.store.model_path(r.round, "onnx").exists()

        assert [r["round"] for r in get_json(f"{url}/api/rounds")] == list(range(ROUNDS + 1))
        assert get_json(f"{url}/api/status")["completed_round"] == ROUNDS
        assert {d["device_id"] for d in get_json(f"{url}/api/devices")} == set(SPEAKERS)

        def last_announced() -> ModelAnnouncement | None:
            # sent before the rounds count as finished, it may reach the broker just after
            announced = _retained_model(service.broker_url, topic_root, service.key.public_key())
            return announced if announced.round == ROUNDS else None

        announced = wait_for(last_announced, 30, "the last round's announcement on the broker")
        assert announced.weights.sha256 == rounds[-1].weights_sha256
        onnx = service.store.model_path(ROUNDS, "onnx").read_bytes()
        assert announced.onnx.sha256 == weights.sha256(onnx)
        assert announced.metrics["accuracy"] == pytest.approx(rounds[-1].accuracy)
        assert json.loads(json.dumps(announced.labels)) == [*(str(d) for d in range(10)), "_none_"]
        processes.stop_all()
    assert all(p.returncode == 0 for p in clients), "devices shut down cleanly on SIGTERM"


def test_hardware_aware_rounds_aggregate_the_first_k(tmp_path, mosquitto_url, topic_root, processes):
    config = {
        "broker": mosquitto_url,
        "topic_root": topic_root,
        "rounds": ROUNDS,
        "min_devices": len(SPEAKERS),
        "min_results": 1,
        "strategy": "hardware",
        "k": 2,
    }
    with running_coordinator(tmp_path, **config) as (service, url):
        clients = start_clients(processes, SPEAKERS, url, mosquitto_url, topic_root, max_samples=40)
        wait_until_finished(service, clients)
        for r in service.store.rounds()[1:]:
            assert r.devices == len(SPEAKERS), "ceil(1.3 x 2) = 3 devices over-selected"
            assert r.results == len(service.store.updates(r.round)) == 2, "the first K results are aggregated"


def test_fedbuff_does_not_wait_for_a_slow_device_and_counts_its_late_update(
    tmp_path, mosquitto_url, topic_root, processes, caplog
):
    config = {
        "broker": mosquitto_url,
        "topic_root": topic_root,
        "rounds": 5,
        "min_devices": 3,
        "eval_every": 0,
        "strategy": "fedbuff",
        "k": 2,
    }
    caplog.set_level("INFO", "fedspeech.coordinator")
    with running_coordinator(tmp_path, **config) as (service, url):
        fast = start_clients(processes, SPEAKERS[:2], url, mosquitto_url, topic_root, max_samples=16)
        slow = start_clients(processes, SPEAKERS[2:], url, mosquitto_url, topic_root, max_samples=96)
        wait_until_finished(service, fast + slow)
        rounds = service.store.rounds()[1:]
        aggregated = {r.round: [u.device_id for u in service.store.updates(r.round)] for r in rounds}
    assert all(len(devices) >= 2 for devices in aggregated.values())
    slow_id = SPEAKERS[2]
    late = [m for m in caplog.messages if f"the update of {slow_id} from round" in m]
    assert late, "the slow device's update came in after its round closed, and counted"
    counted_in = int(late[0].split(":")[0].removeprefix("round "))
    assert slow_id in aggregated[counted_in]
    assert sum(slow_id in devices for devices in aggregated.values()) < len(rounds), "not waited for"


def test_one_process_hosts_a_device_per_speaker(tmp_path, topic_root, processes):
    config = {"broker_port": free_port(), "topic_root": topic_root, "rounds": 2, "min_devices": 3}
    with running_coordinator(tmp_path, **config) as (service, url):
        host = processes.start(
            "host",
            "client",
            *[arg for speaker in SPEAKERS for arg in ("--speaker", speaker)],
            "--coordinator", url,
            "--broker", service.broker_url,
            "--topic-root", topic_root,
            "--max-samples", "24",
            "--state", str(tmp_path / "devices"),
        )  # fmt: skip
        wait_until_finished(service, [host])
        for r in service.store.rounds()[1:]:
            assert sorted(u.device_id for u in service.store.updates(r.round)) == SPEAKERS
        host.send_signal(signal.SIGTERM)
        assert host.wait(30) == 0
        wait_for(lambda: not service.link.online(), 10, "every hosted device offline")


def test_float16_halves_every_download_and_upload(tmp_path, mosquitto_url, topic_root, processes):
    config = {
        "broker": mosquitto_url,
        "topic_root": topic_root,
        "rounds": ROUNDS,
        "min_devices": 2,
        "min_results": 2,
        "eval_every": 0,
        "precision": "float16",
    }
    with running_coordinator(tmp_path, **config) as (service, url):
        clients = start_clients(processes, SPEAKERS[:2], url, mosquitto_url, topic_root, max_samples=24)
        wait_until_finished(service, clients)
        store = service.store
        for r in store.rounds()[1:]:
            half, full = (store.model_path(r.round - 1, k).stat().st_size for k in ("float16", "weights"))
            assert half < 0.51 * full
            assert r.results == 2 and r.accuracy is not None
            assert r.bytes_down == 2 * half, "each device downloads the float16 copy of the global model"
            assert 2 * half * 0.98 < r.bytes_up < 2 * half * 1.05, "and uploads float16"
            arrays, _ = weights.decode(store.model_path(r.round, "weights").read_bytes())
            assert {a.dtype.name for a in arrays.values()} == {"float32"}, "the global model stays float32"
