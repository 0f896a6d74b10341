"""A secure sum's HTTP routes through Flask's test client: who may post what in which phase, and what is
refused with which status, before and after the body is read.
"""

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.coordinator.app import create_app
from fedspeech.coordinator.privacy.secure_sum_server import ServerRound
from fedspeech.edge_client.secure_sum_device import DeviceRound
from fedspeech.protocol import routes, signing
from fedspeech.protocol import secure_sum_wire as wire
from tests.helpers.configs import coordinator_config

DEVICES = ("a", "b", "c")
LENGTH = 16


@pytest.fixture
def http(tmp_path, monkeypatch):
    """A coordinator whose SecureSumUploads holds round 7's secure sum of a, b and c, in its adverts phase."""
    monkeypatch.chdir(tmp_path)
    config = coordinator_config(tmp_path, broker="mqtt://127.0.0.1:1883", eval_limit=10)
    app = create_app(config.changed(state=Path("state")))
    service = app.extensions["fedspeech"]
    keys = {d: Ed25519PrivateKey.generate() for d in DEVICES}
    for d in (*DEVICES, "stranger"):
        service.store.register_device(d, d * 43, 10, {})
    identities = {d: signing.public_key_text(keys[d]) for d in DEVICES}
    server = ServerRound(7, 2, LENGTH, {d: keys[d].public_key() for d in DEVICES})
    service.orchestrator.secure_uploads.open(server, identities)
    client = app.test_client()
    client.keys, client.secure_uploads = keys, service.orchestrator.secure_uploads  # type: ignore[attr-defined]
    return client


def post(http, device: str, phase: str, body: bytes, round: int = 7):
    return http.post(
        routes.secure_sum(round, phase), data=body, headers={"Authorization": f"Bearer {device * 43}"}
    )


def get(http, device: str, phase: str, round: int = 7):
    return http.get(routes.secure_sum(round, phase), headers={"Authorization": f"Bearer {device * 43}"})


def advert(http, device: str) -> bytes:
    return wire.advert_body(DeviceRound(device, 7, 2, http.keys[device]).advert())


def test_adverts_are_taken_from_the_round_s_devices_and_handed_out_once_the_phase_closes(http):
    assert post(http, "a", "adverts", advert(http, "a")).status_code == 200
    assert get(http, "a", "adverts").status_code == 202, "open: nothing to hand out yet"
    assert post(http, "b", "adverts", advert(http, "b")).status_code == 200
    assert http.secure_uploads.close() == ["a", "b"]
    reply = get(http, "b", "adverts")
    assert reply.status_code == 200
    adverts, identities = wire.read_adverts(reply.data, 7)
    assert [a.device_id for a in adverts] == ["a", "b"] and set(identities) == {"a", "b"}
    assert get(http, "c", "adverts").status_code == 409, "c advertised nothing: it gets no adverts"
    assert post(http, "c", "adverts", advert(http, "c")).status_code == 409, "too late"


def test_a_message_refused_changes_nothing(http):
    forged = DeviceRound("a", 7, 2, Ed25519PrivateKey.generate()).advert()  # not a's identity key
    replayed = DeviceRound("a", 6, 2, http.keys["a"]).advert()  # a's own, from round 6
    cases = [
        (post(http, "a", "adverts", wire.advert_body(forged)), 400, "not signed by its device"),
        (post(http, "a", "adverts", wire.advert_body(replayed)), 400, "not signed by its device"),
        (post(http, "b", "adverts", advert(http, "a")), 400, "not signed by its device"),
        (post(http, "a", "adverts", b"{not json"), 400, "not JSON"),
        (post(http, "a", "adverts", advert(http, "a")[:-20] + b'"}'), 400, "base64"),
        (post(http, "stranger", "adverts", advert(http, "a")), 409, "not expected"),
        (post(http, "a", "adverts", advert(http, "a"), round=6), 409, "no secure sum of round 6"),
        (post(http, "a", "shares", b"{}"), 409, "not taken now"),
        (http.post(routes.secure_sum(7, "adverts"), data=advert(http, "a")), 401, "missing bearer token"),
    ]
    for reply, status, reason in cases:
        assert reply.status_code == status and reason in reply.get_json()["error"], reply.get_json()
    assert post(http, "a", "adverts", advert(http, "a")).status_code == 200, "a's own advert is still taken"
    assert post(http, "a", "adverts", advert(http, "a")).status_code == 409, "once"


def test_a_masked_update_of_the_wrong_size_is_refused_before_its_body_is_read(http):
    devices = {d: DeviceRound(d, 7, 2, http.keys[d]) for d in ("a", "b")}
    for d, device in devices.items():
        post(http, d, "adverts", wire.advert_body(device.advert()))
    http.secure_uploads.close()
    adverts, identities = wire.read_adverts(get(http, "a", "adverts").data, 7)
    for d, device in devices.items():
        assert post(http, d, "shares", wire.shares_body(device.share(adverts, identities))).status_code == 200
    assert http.secure_uploads.close() == ["a", "b"]  # the masked phase is open
    assert post(http, "a", "masked", bytes(4 * LENGTH + 4)).status_code == 413
    short = post(http, "a", "masked", bytes(4 * LENGTH - 4))
    assert short.status_code == 400 and "not 64" in short.get_json()["error"]
    assert post(http, "c", "masked", bytes(4 * LENGTH)).status_code == 409, "c shared no keys"
    assert post(http, "a", "masked", bytes(4 * LENGTH)).status_code == 200
