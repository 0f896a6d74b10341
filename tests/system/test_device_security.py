"""A fleet no stranger can steer, from the device's side: signed tasks and announcements, rounds that only
move forward, bounded downloads, a stop between batches, kept credentials, HTTPS with a private CA.

The device runs for real (in a thread, or as a `fedspeech client` process) against the machine's Mosquitto
and test_edge_client's HTTP double of the coordinator, which signs with a real Ed25519 key.
"""

import datetime
import ipaddress
import logging
import re
import signal
import ssl
import threading
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.edge_client import Refused, run_client
from fedspeech.protocol import messages, signing, weights
from fedspeech.protocol.messages import BlobRef, DeviceStatus
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.runtime.http_requests import fetch_blob, request
from fedspeech.runtime.model_follower import ModelFollower
from tests.helpers.device_doubles import (
    BLOB_PATH,
    BROKER_URL,
    SPEC,
    CoordinatorDouble,
    Fleet,
    client_args,
    fleet_of,
    make_announcement,
    make_task,
    retained,
    running_daemon,
    wait_until,
    warnings_about,
)

pytestmark = pytest.mark.timeout(120)

SECRET = "enrolment-secret-0123456789abcdef"


@pytest.fixture
def fleet(reference: weights.Arrays, tmp_path: Path) -> Iterator[Fleet]:
    with fleet_of(CoordinatorDouble(weights.encode(reference)), tmp_path / "device-state") as fleet:
        yield fleet


@pytest.fixture(scope="module")
def reference() -> weights.Arrays:
    from fedspeech.models import build_model
    from fedspeech.models.train import get_arrays

    return get_arrays(build_model(SPEC))


# ---- signed tasks ----


def test_forged_tasks_are_dropped_and_real_ones_done(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    coordinator = fleet.coordinator
    genuine = make_task("real", blob=coordinator.blob)
    stranger = Ed25519PrivateKey.generate()
    forgeries = [
        # (what the attacker sends, the reason the device logs)
        (
            lambda: fleet.publish_task(messages.encode(replace(genuine, task_id="unsigned"))),
            "not a signed message",
        ),
        (lambda: fleet.send_task(replace(genuine, task_id="stranger"), key=stranger), "bad signature"),
        (lambda: _replay_for_another_device(fleet, replace(genuine, task_id="other")), "bad signature"),
        # signed by the coordinator's own key, and still refused: what a task may ask is bounded
        (
            lambda: fleet.send_task(replace(genuine, task_id="greedy", epochs=100_000)),
            "epochs must be 1 to 100",
        ),
        (
            lambda: fleet.send_task(replace(genuine, task_id="elsewhere", upload_path="/api/devices")),
            "not the path of a round's updates: '/api/devices'",
        ),
        (
            lambda: fleet.send_task(replace(genuine, task_id="forever", deadline=time.time() + 365 * 86400)),
            "more than a task's 21600 s",
        ),
    ]
    with running_daemon(fleet) as (_, thread):
        for publish, reason in forgeries:
            publish()
            wait_until(lambda r=reason: warnings_about(caplog, r))
        assert thread.is_alive()
        assert coordinator.downloads == [] and coordinator.uploads == []
        fleet.send_task(genuine)
        wait_until(lambda: coordinator.uploads)
    assert [u.task_id for u in coordinator.uploads] == ["real"]
    assert coordinator.downloads == [BLOB_PATH]


def _replay_for_another_device(fleet: Fleet, task) -> None:
    """A genuine task, signed for another device's topic, published on this device's."""
    other_topic = fleet.topics.task("another-device")
    payload = signing.sign(fleet.coordinator.key, other_topic, messages.encode(task))
    fleet.publish_task(payload)


def test_a_task_past_its_deadline_stops_training(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    coordinator = fleet.coordinator
    with running_daemon(fleet, max_samples=None):  # all 450 of the speaker's training clips
        # 100 epochs would take minutes; the deadline comes after a few seconds of them
        fleet.send_task(replace(make_task("long", blob=coordinator.blob, deadline_in=4.0), epochs=100))
        wait_until(
            lambda: warnings_about(caplog, "dropping task long of round 1: its deadline passed during")
        )
        fleet.send_task(make_task("next", blob=coordinator.blob))
        wait_until(lambda: coordinator.uploads, timeout=60)
    assert [u.task_id for u in coordinator.uploads] == ["next"]


def test_sigterm_while_training_ends_the_device_within_5_s(fleet: Fleet, processes) -> None:
    process = processes.start("client", *client_args(fleet, max_samples=None))  # all 450 training clips
    wait_until(lambda: any(s.state == "online" for s in fleet.statuses()), timeout=60)
    fleet.send_task(replace(make_task("long", blob=fleet.coordinator.blob, deadline_in=3600), epochs=100))
    wait_until(lambda: fleet.statuses()[-1].state == "training")
    time.sleep(1.0)  # well into its minutes of training
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code = process.wait(30)
    seconds = time.monotonic() - start
    print(f"SIGTERM to exit while training: {seconds:.2f} s")
    assert code == 0
    assert seconds < 5.0, f"the device took {seconds:.1f} s to stop"  # the bound, not a benchmark
    status = messages.decode(retained(fleet.topics.status(fleet.device_id)), DeviceStatus)
    assert status.state == "offline"
    assert fleet.coordinator.uploads == []
    assert "Traceback" not in process.log_path.read_text()


# ---- rounds only move forward ----


def test_the_kept_model_never_goes_back_even_across_a_restart(fleet: Fleet, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="fedspeech.edge_client")
    models = tmp_path / "models"
    kept = models / "model.onnx"
    topic = fleet.topics.model
    fleet.announce(5, b"onnx of round 5")
    old_payload = retained(topic)  # the genuine, signed announcement of round 5
    with running_daemon(fleet, model_dir=models):
        wait_until(lambda: kept.exists())
        fleet.announce(6, b"onnx of round 6")
        wait_until(lambda: kept.read_bytes() == b"onnx of round 6")
        _send_bad_announcements(fleet, caplog, old_payload)
        assert kept.read_bytes() == b"onnx of round 6"
    fleet.publish(topic, old_payload)  # what a restarted device finds retained
    with running_daemon(fleet, model_dir=models):
        wait_until(lambda: len(warnings_about(caplog, "round 5: ignoring it, round 6")) == 2)
        fleet.publish(topic, signing.sign(fleet.coordinator.key, topic, messages.encode(_round_6(fleet))))
        held = "round 6: its model is held already"
        wait_until(lambda: any(held in r.getMessage() for r in caplog.records))
    assert kept.read_bytes() == b"onnx of round 6"
    assert fleet.coordinator.downloads == ["/api/models/5/onnx", "/api/models/6/onnx"]


def _round_6(fleet: Fleet):
    return make_announcement(fleet.coordinator, 6, b"onnx of round 6")


def _send_bad_announcements(fleet: Fleet, caplog: pytest.LogCaptureFixture, old_payload: bytes) -> None:
    """Replay round 5's genuine announcement, forge round 99999 and a path to another port; each refused."""
    topic, key = fleet.topics.model, fleet.coordinator.key
    fleet.publish(topic, old_payload)
    wait_until(lambda: warnings_about(caplog, "round 5"))
    forged = make_announcement(fleet.coordinator, 99999, b"an attacker's model")
    fleet.publish(topic, messages.encode(forged))  # unsigned
    wait_until(lambda: len(warnings_about(caplog, "not a signed message")) == 1)
    elsewhere = replace(forged, onnx=replace(forged.onnx, path=":18081/api/models/1/onnx"))
    fleet.publish(topic, signing.sign(Ed25519PrivateKey.generate(), topic, messages.encode(elsewhere)))
    wait_until(lambda: warnings_about(caplog, "bad signature"))
    fleet.publish(topic, signing.sign(key, topic, messages.encode(elsewhere)))  # even with the right key
    wait_until(lambda: warnings_about(caplog, "not the path of a round's onnx: ':18081/api/models/1/onnx'"))


def test_the_listener_keeps_its_model_against_forged_and_replayed_announcements(
    fleet: Fleet, fsdd_model, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fedspeech.edge_client")
    onnx = fsdd_model.onnx_path.read_bytes()
    topic = fleet.topics.model
    follower = ModelFollower(fleet.coordinator.url, BrokerSettings(BROKER_URL), fleet.topics.root)
    fleet.announce(5, onnx)
    old_payload = retained(topic)
    follower.start()  # no key given: it asks the coordinator for its own, and says how to pin it
    try:
        assert warnings_about(caplog, f"pin it with --coordinator-key {fleet.coordinator.public_key}")
        wait_until(lambda: follower.model is not None)
        fifth = follower.model
        fleet.announce(6, onnx)
        wait_until(lambda: follower.model is not fifth)
        sixth = follower.model
        _send_bad_announcements(fleet, caplog, old_payload)
        fleet.publish(topic, signing.sign(fleet.coordinator.key, topic, messages.encode(_round_6(fleet))))
        wait_until(
            lambda: any("round 6: its model is held already" in r.getMessage() for r in caplog.records)
        )
        assert follower.model is sixth, "no other model was loaded"
    finally:
        follower.stop()
    assert fleet.coordinator.downloads == ["/api/models/5/onnx", "/api/models/6/onnx"]


def test_a_listener_given_a_key_takes_nothing_signed_by_another(fleet: Fleet, fsdd_model, caplog) -> None:
    pinned = signing.public_key_text(Ed25519PrivateKey.generate())
    follower = ModelFollower(
        fleet.coordinator.url, BrokerSettings(BROKER_URL), fleet.topics.root, coordinator_key=pinned
    )
    fleet.announce(5, fsdd_model.onnx_path.read_bytes())
    follower.start()
    try:
        wait_until(lambda: warnings_about(caplog, "bad signature"))
        assert follower.model is None
    finally:
        follower.stop()
    assert fleet.coordinator.downloads == []


# ---- bounded downloads ----


def test_a_download_longer_than_announced_is_cut_and_refused(fleet: Fleet, caplog) -> None:
    coordinator = fleet.coordinator
    path = "/api/models/1/weights"
    coordinator.endless.add(path)  # a server that never stops sending
    ref = BlobRef(path, "0" * 64, 1000)
    with pytest.raises(weights.WeightsError, match="got 1001 bytes or more, expected 1000"):
        fetch_blob(coordinator.url, ref)
    with running_daemon(fleet):  # a device's task does the same
        task = make_task("endless", blob=coordinator.blob)
        fleet.send_task(replace(task, weights=replace(task.weights, path=path)))
        wait_until(lambda: warnings_about(caplog, f"got {len(coordinator.blob) + 1} bytes or more"))
    assert coordinator.uploads == []


# ---- credentials kept on the device ----


def test_the_kept_token_survives_a_restart(fleet: Fleet) -> None:
    coordinator = fleet.coordinator
    with running_daemon(fleet):
        pass
    token_file = fleet.state_dir / "token"
    first = coordinator.token
    assert token_file.read_text().strip() == first
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert fleet.state_dir.stat().st_mode & 0o077 == 0, "the device's folder is its own"
    assert (fleet.state_dir / "coordinator.pub").read_text().strip() == coordinator.public_key
    with running_daemon(fleet):
        pass
    assert coordinator.authorizations == [None, f"Bearer {first}"]
    assert token_file.read_text().strip() == coordinator.token != first


def test_a_refused_token_falls_back_to_the_enrolment_secret(fleet: Fleet) -> None:
    coordinator = fleet.coordinator
    coordinator.secret = SECRET  # closed enrolment: the operator ran `fedspeech devices add`
    fleet.state_dir.mkdir(parents=True)
    (fleet.state_dir / "token").write_text("revoked-token-0123456789\n")
    with running_daemon(fleet, enrolment_secret=SECRET):
        fleet.send_task(make_task(blob=coordinator.blob))
        wait_until(lambda: coordinator.uploads)
    assert coordinator.authorizations == ["Bearer revoked-token-0123456789", f"Bearer {SECRET}"]
    assert (fleet.state_dir / "token").read_text().strip() == coordinator.token


def test_a_refused_registration_stops_the_device_with_what_to_do(fleet: Fleet, caplog) -> None:
    fleet.coordinator.secret = SECRET
    caplog.set_level(logging.INFO, "fedspeech.edge_client.coordinator_http")
    with pytest.raises(Refused, match=f"`fedspeech devices add {fleet.device_id}`.*--enrolment-secret-file"):
        run_client(fleet.config(), threading.Event())
    assert warnings_about(caplog, "refused to register")
    refused = (
        f"refused to register {fleet.device_id} as a new device, with no token or secret (HTTP 403: enrol"
    )
    assert refused in caplog.text
    with pytest.raises(Refused, match="refused to register"):
        run_client(fleet.config(enrolment_secret="a-wrong-secret"), threading.Event())
    assert fleet.coordinator.uploads == [] and not (fleet.state_dir / "token").exists()


def test_a_refused_registration_ends_the_command_with_one_line(fleet: Fleet, processes) -> None:
    fleet.coordinator.secret = SECRET
    process = processes.start("client", *client_args(fleet))
    assert process.wait(60) == 1
    log = process.log_path.read_text()
    assert "Traceback" not in log
    last = log.strip().splitlines()[-1]
    assert last.startswith("fedspeech client: ") and f"fedspeech devices add {fleet.device_id}" in last, last


def test_a_coordinator_with_another_key_is_refused(fleet: Fleet, caplog) -> None:
    coordinator = fleet.coordinator
    with running_daemon(fleet):
        pass
    token = (fleet.state_dir / "token").read_text()
    genuine_key = coordinator.public_key
    coordinator.key = Ed25519PrivateKey.generate()  # an impostor at the coordinator's address
    with pytest.raises(Refused, match=re.escape(f"not with the pinned key {genuine_key}")):
        run_client(fleet.config(), threading.Event())
    assert warnings_about(caplog, "it may be an impostor")
    assert (fleet.state_dir / "token").read_text() == token, "nothing the impostor sent is kept"
    assert (fleet.state_dir / "coordinator.pub").read_text().strip() == genuine_key


def test_a_key_given_by_the_operator_is_pinned_from_the_first_registration(fleet: Fleet) -> None:
    other = signing.public_key_text(Ed25519PrivateKey.generate())
    with pytest.raises(Refused, match=re.escape(f"not with the pinned key {other}")):
        run_client(fleet.config(coordinator_key=other), threading.Event())
    with running_daemon(fleet, coordinator_key=fleet.coordinator.public_key):
        pass
    assert (fleet.state_dir / "coordinator.pub").read_text().strip() == fleet.coordinator.public_key


# ---- HTTPS with a private CA ----


def _private_ca(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA certificate file and a server TLS context with a certificate it signed for localhost."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedspeech test CA")])
    usage = dict(content_commitment=False, key_encipherment=False, data_encipherment=False)
    usage |= dict(key_agreement=False, encipher_only=False, decipher_only=False)
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, **usage), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    ca_file.write_bytes(ca.public_bytes(pem))
    cert_file.write_bytes(server.public_bytes(pem))
    key_file.write_bytes(
        server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return ca_file, context


def test_a_coordinator_behind_https_with_a_private_ca(reference, tmp_path: Path) -> None:
    ca_file, server_tls = _private_ca(tmp_path)
    coordinator = CoordinatorDouble(weights.encode(reference), tls=server_tls)
    with fleet_of(coordinator, tmp_path / "device-state") as fleet:
        assert coordinator.url.startswith("https://localhost:")
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # unknown to the system
            request("GET", coordinator.url + "/api/status")
        with running_daemon(fleet, coordinator_ca=ca_file):
            online = next(s for s in fleet.statuses() if s.state == "online")
            assert online.profile.rtt_ms is not None  # the round-trip is measured over HTTPS too
            fleet.send_task(make_task(blob=coordinator.blob))
            wait_until(lambda: coordinator.uploads)
        assert [u.task_id for u in coordinator.uploads] == ["task-1"]
