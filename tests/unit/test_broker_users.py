"""The broker's users in the coordinator's state (`fedspeech broker-config`) and as a device keeps them."""

import base64
import os
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedspeech.coordinator.broker import broker_users
from fedspeech.coordinator.fleet.enrolment import add_device, revoke_device
from fedspeech.coordinator.state.store import Store
from fedspeech.edge_client.credentials import DeviceCredentials, issued_login
from fedspeech.protocol import messages, signing
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import Credentials
from fedspeech.protocol.mqtt import BrokerSettings

# written by Mosquitto 2.0.11's `mosquitto_passwd -c -b FILE alice s3cret`
MOSQUITTO_PASSWD_LINE = (
    "alice:$7$101$TRQKO8UB9WJM8kHr$9IDrhTSnRnpu29tsWmQhlF1JcouoP1ZqgJR3mTju40EOOP4QQGPiTSTsBQRS4fyO7MZPlNkvDsdto"
    "nIqtuRrQg=="
)
KEY = signing.public_key_text(Ed25519PrivateKey.generate())


def users(state) -> dict[str, str]:
    """passwd's users and their hashes."""
    lines = (state / "broker" / "passwd").read_text().splitlines()
    return dict(line.split(":", 1) for line in lines)


def test_the_hash_is_the_one_mosquitto_passwd_writes():
    salt = base64.b64decode(MOSQUITTO_PASSWD_LINE.split("$")[3])
    assert f"alice:{broker_users.mosquitto_hash('s3cret', salt)}" == MOSQUITTO_PASSWD_LINE
    assert broker_users.mosquitto_hash("s3cret", salt) != broker_users.mosquitto_hash("s3cret")  # salted


def test_the_config_names_a_user_per_client_and_refuses_anonymous_clients(tmp_path):
    state = tmp_path / "state"
    config = broker_users.write_config(state, "0.0.0.0", 1884, "fleet/v2", ["kitchen-pi"])
    text = config.read_text()
    for line in ("allow_anonymous false", "listener 1884 0.0.0.0", "use_username_as_clientid true"):
        assert f"\n{line}\n" in text
    assert text.index("listener") < text.index("use_username_as_clientid")  # a listener's own option
    assert set(users(state)) == {"coordinator", "homeassistant", "kitchen-pi", "kitchen-pi-listen"}
    acl = (state / "broker" / "acl").read_text()
    assert (
        "pattern write fleet/v2/devices/%u/status\n" in acl
        and "pattern read fleet/v2/devices/%u/task\n" in acl
    )
    for private in (
        "passwd",
        "coordinator.password",
        "homeassistant.password",
        "devices/kitchen-pi.password",
    ):
        assert stat.S_IMODE(os.stat(state / "broker" / private).st_mode) == 0o600
    with pytest.raises(ValueError, match="--topic-root"):
        broker_users.write_config(state, "0.0.0.0", 1884, "fleet/#", [])


def test_writing_again_keeps_passwords_and_drops_devices_no_longer_known(tmp_path):
    state = tmp_path / "state"
    broker_users.write_config(state, "127.0.0.1", 1883, "fedspeech/v1", ["kitchen-pi", "hall-pi"])
    kept = broker_users.device_logins(state, "kitchen-pi")
    broker_users.write_config(state, "127.0.0.1", 1883, "fedspeech/v1", ["kitchen-pi", "coordinator"])
    assert broker_users.device_logins(state, "kitchen-pi") == kept
    # hall-pi is gone; a device named coordinator (open enrolment) gets no user: it would be the coordinator
    assert set(users(state)) == {"coordinator", "homeassistant", "kitchen-pi", "kitchen-pi-listen"}


def test_enrolling_and_revoking_add_and_remove_a_devices_users(tmp_path):
    store = Store(tmp_path / "state")
    add_device(store, "kitchen-pi")
    assert broker_users.device_logins(store.dir, "kitchen-pi") is None  # no broker config yet
    broker_users.write_config(store.dir, "127.0.0.1", 1883, "fedspeech/v1", ["kitchen-pi"])
    add_device(store, "hall-pi")
    assert {"hall-pi", "hall-pi-listen"} <= set(users(store.dir))
    for reserved in ("coordinator", "homeassistant", "hall-pi-listen"):
        with pytest.raises(ValueError, match="other broker users"):
            add_device(store, reserved)
    assert revoke_device(store, "hall-pi")
    assert set(users(store.dir)) == {"coordinator", "homeassistant", "kitchen-pi", "kitchen-pi-listen"}
    with pytest.raises(ValueError):  # never a path out of the device folder
        broker_users.remove_device(store.dir, "../coordinator")
    assert broker_users.coordinator_password_file(store.dir) is not None
    assert broker_users.home_assistant_password_file(store.dir) is not None


def test_a_device_keeps_its_issued_passwords_privately_and_an_operators_login_wins(tmp_path):
    credentials = DeviceCredentials(tmp_path / "kitchen-pi")
    password, listen = "b" * 43, "c" * 43
    credentials.keep(Credentials("kitchen-pi", "a" * 43, KEY, password, listen), "http://coordinator")
    kept = credentials.folder / "broker-password"
    assert kept.read_text() == f"{password}\n" and stat.S_IMODE(os.stat(kept).st_mode) == 0o600
    settings = credentials.broker_login(BrokerSettings(), "kitchen-pi")
    assert (settings.username, settings.password_file) == ("kitchen-pi", kept)
    given = BrokerSettings(username="operator")
    assert credentials.broker_login(given, "kitchen-pi") == given
    assert issued_login(BrokerSettings(), "x-listen", tmp_path / "none") == BrokerSettings()

    credentials.keep(Credentials("kitchen-pi", "d" * 43, KEY), "http://coordinator")  # a broker without
    assert not kept.exists() and credentials.broker_login(BrokerSettings(), "kitchen-pi") == BrokerSettings()


def test_credentials_carry_bounded_passwords():
    good = Credentials("kitchen-pi", "a" * 43, KEY, "b" * 43, "c" * 43)
    assert messages.decode(messages.encode(good), Credentials) == good
    for bad in ("", "x" * 200, "a b" * 10, "ab\ncd" * 5):
        with pytest.raises(ProtocolError, match="bad broker password"):
            messages.decode(messages.encode(Credentials("kitchen-pi", "a" * 43, KEY, bad)), Credentials)
