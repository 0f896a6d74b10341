"""Each method of FedBN, FedVMR and FedCSR for 2 rounds: a coordinator, Mosquitto, real device processes."""

import logging
import shutil
from pathlib import Path

import pytest

from fedspeech.coordinator.strategies import strategy_params
from fedspeech.models.clips.datasets import client_clips, load_corpus
from fedspeech.protocol import weights
from tests.helpers.coordinators import running_coordinator, wait_until_finished
from tests.helpers.devices import start_clients

SPEAKERS = ["jackson", "nicolas"]
ROUNDS = 2


def _folder_of_training_clips(folder: Path, per_speaker: int) -> Path:
    """DIR/<label>/* holding the first training clips of each speaker: clips devices would share."""
    corpus = load_corpus("fsdd")
    for speaker in SPEAKERS:
        for clip in client_clips(corpus, speaker)[0][:per_speaker]:
            (folder / corpus.labels[clip.label]).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(clip.path, folder / corpus.labels[clip.label] / clip.path.name)
    return folder


def _run(tmp_path, processes, mosquitto_url, topic_root, config, caplog, *device_args: str):
    """Two rounds of the method over Mosquitto, devices started with device_args; returns the service."""
    caplog.set_level(logging.INFO, logger="fedspeech")
    settings = {
        "broker": mosquitto_url,
        "topic_root": topic_root,
        "rounds": ROUNDS,
        "min_devices": len(SPEAKERS),
        "min_results": 1,
        "eval_every": 0,
        **config,
    }
    with running_coordinator(tmp_path, **settings) as (service, url):
        clients = start_clients(processes, SPEAKERS, url, service.broker_url, topic_root, 30, *device_args)
        wait_until_finished(service, clients)
        rounds = service.store.rounds()
        assert [r.round for r in rounds] == [0, 1, 2]
        for r in rounds[1:]:
            assert sorted(u.device_id for u in service.store.updates(r.round)) == SPEAKERS
    for speaker in SPEAKERS:  # a task a device cannot honour is dropped with a warning
        assert "dropping task" not in (processes.log_dir / f"client-{speaker}.log").read_text()
    return service


def test_fedbn_keeps_normalisation_on_the_devices(tmp_path, processes, mosquitto_url, topic_root, caplog):
    config = {"strategy": "fedbn", "model": "cnn_bn", "eval_every": ROUNDS}
    service = _run(tmp_path, processes, mosquitto_url, topic_root, config, caplog)
    first, last = (
        weights.decode(service.store.model_path(r, "weights").read_bytes())[0] for r in (0, ROUNDS)
    )
    norm = service.orchestrator.model.norm_names()
    assert norm and all((first[n] == last[n]).all() for n in norm), "normalisation is never aggregated"
    assert any((first[n] != last[n]).any() for n in first.keys() - norm), "the rest is"
    for speaker in SPEAKERS:
        kept = list((processes.log_dir / "devices" / speaker).glob("*norm*"))
        assert kept, f"{speaker} keeps its own normalisation layers"
    record = service.store.rounds()[-1]
    assert record.federated_accuracy is not None, "the devices evaluated their personalised models"


def test_silobn_has_each_device_run_with_its_own_statistics(
    tmp_path, processes, mosquitto_url, topic_root, caplog
):
    from fedspeech.edge_client.local_norm import NORM_FILE

    config = {"strategy": "silobn", "model": "cnn_bn", "eval_every": ROUNDS}
    service = _run(tmp_path, processes, mosquitto_url, topic_root, config, caplog)
    last = weights.decode(service.store.model_path(ROUNDS, "weights").read_bytes())[0]
    statistics = {n for n in service.orchestrator.model.norm_names() if n.endswith(("_mean", "_var"))}
    kept = {
        speaker: weights.decode((processes.log_dir / "devices" / speaker / NORM_FILE).read_bytes())[0]
        for speaker in SPEAKERS
    }
    for speaker, own in kept.items():
        assert own.keys() == statistics, f"{speaker} keeps the statistics and nothing else"
        assert any((own[n] != last[n]).any() for n in statistics), "its own, not the global model's"
    assert any((kept["jackson"][n] != kept["nicolas"][n]).any() for n in statistics)
    assert service.store.rounds()[-1].federated_accuracy is not None, "the devices evaluated their own"


def test_quality_weights_by_validation_scores(tmp_path, processes, mosquitto_url, topic_root, caplog):
    validation = _folder_of_training_clips(tmp_path / "validation", 10)
    config = {"strategy": "quality", "validation_data": validation}
    _run(tmp_path, processes, mosquitto_url, topic_root, config, caplog)
    assert caplog.text.count("validation scores") == ROUNDS


def test_quality_on_clips_devices_chose_to_share(tmp_path, processes, mosquitto_url, topic_root, caplog):
    config = {"strategy": "quality", "shared_validation": 5}
    service = _run(tmp_path, processes, mosquitto_url, topic_root, config, caplog, "--share-validation", "3")
    waveforms, labels = service.shared_validation.clips()
    assert len(labels) == 3 * len(SPEAKERS) and len(set(labels.tolist())) == 3, "in turn from each label"
    for speaker in SPEAKERS:
        assert "sharing 3 training clips" in (processes.log_dir / f"client-{speaker}.log").read_text()


@pytest.mark.parametrize("groups", [1])
def test_grouped_sequential_relays_the_model(tmp_path, processes, mosquitto_url, topic_root, caplog, groups):
    config = {"strategy": "grouped", "strategy_settings": strategy_params("grouped", {"groups": groups})}
    _run(tmp_path, processes, mosquitto_url, topic_root, config, caplog)
    assert caplog.text.count("trains from the update of") == ROUNDS, "the second device of each round"


def test_class_prior_pools_predicted_counts(tmp_path, processes, mosquitto_url, topic_root, caplog):
    service = _run(tmp_path, processes, mosquitto_url, topic_root, {"strategy": "class_prior"}, caplog)
    prior = service.orchestrator.strategy.prior
    assert prior is not None and len(prior) == 11 and abs(sum(prior) - 1) < 1e-9


def test_mkd_sends_the_server_model(tmp_path, processes, mosquitto_url, topic_root, caplog):
    server = _folder_of_training_clips(tmp_path / "server", 10)
    config = {"strategy": "mkd", "server_data": server}
    service = _run(tmp_path, processes, mosquitto_url, topic_root, config, caplog)
    assert service.store.model_path(1, "teacher").exists() and service.store.model_path(2, "teacher").exists()
