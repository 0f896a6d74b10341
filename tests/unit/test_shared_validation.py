"""Validation clips a device chooses to share: taken only where the operator allows, bounded and checked."""

import numpy as np
import pytest

from fedspeech.coordinator.app import create_app
from fedspeech.edge_client.validation_share import pick_clips
from fedspeech.protocol import messages, routes, weights
from fedspeech.protocol.messages import Credentials, Profile, Registration
from tests.helpers.configs import coordinator_config

NUM_SAMPLES = 8000  # the FSDD task: 1 s at 8 kHz
MAX_CLIPS = 4


@pytest.fixture
def app(tmp_path):
    settings = {"open_enrolment": True, "strategy": "quality", "shared_validation": MAX_CLIPS}
    return create_app(coordinator_config(tmp_path, **settings))


def _token(client, device_id: str = "dev-1") -> str:
    body = messages.encode(Registration(device_id, 40, Profile(1, 0.0, 256.0)))
    reply = client.post(routes.DEVICES, data=body)
    assert reply.status_code == 200, reply.json
    return messages.decode(reply.data, Credentials).token


def _clips(count: int = 3, num_samples: int = NUM_SAMPLES, **arrays: np.ndarray) -> bytes:
    rng = np.random.default_rng(0)
    waveforms = (rng.standard_normal((count, num_samples)) * 0.1).astype(np.float32)
    labels = np.arange(count, dtype=np.int64) % 10
    return weights.encode({"waveforms": waveforms, "labels": labels, **arrays})


def _post(client, body: bytes, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post(routes.VALIDATION, data=body, headers=headers)


def test_shared_clips_are_kept_and_scored_on(app):
    client = app.test_client()
    token = _token(client)
    model = app.extensions["fedspeech"].orchestrator.model
    assert model.score(model.initial(0)) is None, "no clips yet: nothing to score on"
    reply = _post(client, _clips(3), token)
    assert reply.status_code == 200 and reply.json["accepted"] == 3
    waveforms, labels = app.extensions["fedspeech"].shared_validation.clips()
    assert waveforms.shape == (3, NUM_SAMPLES) and labels.tolist() == [0, 1, 2]
    assert 0.0 <= model.score(model.initial(0)) <= 1.0
    assert _post(client, _clips(2), token).status_code == 200
    assert len(app.extensions["fedspeech"].shared_validation.clips()[1]) == 2, (
        "the latest replace the earlier"
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not safetensors", "safetensors"),
        (_clips(2, NUM_SAMPLES - 1), "shape"),
        (_clips(2, extra=np.zeros(1, np.float32)), "exactly"),
        (
            weights.encode(
                {"waveforms": np.full((1, NUM_SAMPLES), np.nan, np.float32), "labels": np.zeros(1, np.int64)}
            ),
            "finite",
        ),
        (
            weights.encode(
                {"waveforms": np.full((1, NUM_SAMPLES), 3.0, np.float32), "labels": np.zeros(1, np.int64)}
            ),
            "within",
        ),
        (
            weights.encode(
                {"waveforms": np.zeros((1, NUM_SAMPLES), np.float32), "labels": np.full(1, 11, np.int64)}
            ),
            "class indices",
        ),
        (
            weights.encode(
                {"waveforms": np.zeros((1, NUM_SAMPLES), np.float64), "labels": np.zeros(1, np.int64)}
            ),
            "float32",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_bad_clips_are_refused_and_nothing_is_kept(app, body, reason):
    client = app.test_client()
    reply = _post(client, body, _token(client))
    assert reply.status_code == 400 and reason in reply.json["error"]
    assert app.extensions["fedspeech"].shared_validation.clips() is None


def test_clips_need_a_device_token_and_a_bounded_body(app):
    client = app.test_client()
    assert _post(client, _clips(1), None).status_code == 401
    assert _post(client, _clips(1), "x" * 32).status_code == 401
    huge = b"\0" * (app.extensions["fedspeech"].shared_validation.max_body + 1)
    token = _token(client)
    assert _post(client, huge, token).status_code == 413
    assert _post(client, _clips(MAX_CLIPS + 1), token).status_code == 413, "more clips than it takes"


def test_a_coordinator_that_takes_no_clips_says_so(tmp_path):
    app = create_app(coordinator_config(tmp_path, open_enrolment=True))
    client = app.test_client()
    reply = _post(client, _clips(1), _token(client))
    assert reply.status_code == 409 and "no shared validation clips" in reply.json["error"]


def test_quality_without_any_validation_set_refuses_to_start(tmp_path):
    with pytest.raises(ValueError, match="--validation-data DIR.*--shared-validation N"):
        create_app(coordinator_config(tmp_path, strategy="quality"))


def test_clips_are_picked_in_turn_from_each_label():
    labels = np.array([0, 0, 0, 1, 2, 2])
    assert pick_clips(labels, 4).tolist() == [0, 1, 3, 4]
    assert pick_clips(labels, 100).tolist() == list(range(6))
    assert pick_clips(labels, 0).tolist() == []


def test_a_device_shares_a_bounded_number_of_clips(tmp_path):
    from fedspeech.edge_client.daemon import MAX_SHARED_CLIPS, ClientConfig
    from fedspeech.edge_client.local_data import DataSource
    from fedspeech.protocol.mqtt import BrokerSettings

    def config(count: int) -> ClientConfig:
        broker = BrokerSettings("mqtt://127.0.0.1:1883")
        source = DataSource(folder=tmp_path)
        return ClientConfig("http://127.0.0.1:8080", broker, "d1", source, tmp_path, share_validation=count)

    config(MAX_SHARED_CLIPS).check()
    for count in (-1, MAX_SHARED_CLIPS + 1):
        with pytest.raises(ValueError, match="share at most"):
            config(count).check()
