"""The coordinator's state directory: devices, tokens, rounds and model files survive a reopen."""

import os
import sqlite3
import stat
from dataclasses import replace

import pytest

from fedspeech.coordinator.state.records import RoundRecord, UpdateRecord
from fedspeech.coordinator.state.store import DATABASE, StateError, Store, token_digest


def _record(round: int) -> RoundRecord:
    return RoundRecord(round, 1.0, 2.0, 1.0, 3, 2, 0.5, 0.4, 1.2, 100, 200, "ab" * 32, "cd" * 32)


def test_devices_and_tokens(tmp_path):
    store = Store(tmp_path)
    store.register_device("dev-1", "secret-1", 10, {"cpu_count": 4})
    store.register_device("dev-2", "secret-2", 20, {})
    assert store.device_for_token("secret-2") == "dev-2"
    assert store.device_for_token("nope") is None
    store.register_device("dev-1", "secret-3", 11, {})
    assert store.device_for_token("secret-1") is None
    assert store.device_for_token("secret-3") == "dev-1"
    assert [d.num_samples for d in Store(tmp_path).devices()] == [11, 20]
    assert b"secret-3" not in (tmp_path / "state.sqlite3").read_bytes()


def test_enrolled_devices_keep_their_secret_until_deleted(tmp_path):
    store = Store(tmp_path)
    assert store.enrol_device("kitchen", "the-secret")
    assert not store.enrol_device("kitchen", "another"), "an id is enrolled once"
    assert store.credentials("kitchen").secret_sha256 == token_digest("the-secret")
    assert store.credentials("kitchen").token_sha256 == "", "enrolled, no token yet"
    assert store.device_for_token("") is None, "no token matches a device without one"
    assert store.registered() == set()
    kitchen = store.device("kitchen")
    assert kitchen.enrolled and not kitchen.registered

    store.register_device("kitchen", "its-token", 30, {})
    assert store.credentials("kitchen").secret_sha256 == token_digest("the-secret"), "the secret stays"
    assert store.device_for_token("its-token") == "kitchen" and store.registered() == {"kitchen"}
    assert store.device("kitchen").registered and store.device("kitchen").num_samples == 30
    assert b"the-secret" not in (tmp_path / "state.sqlite3").read_bytes()

    assert store.delete_device("kitchen") and not store.delete_device("kitchen")
    assert store.credentials("kitchen") is None and store.device_for_token("its-token") is None
    assert store.count_devices() == 0


def test_a_state_directory_from_before_enrolment_secrets_is_migrated(tmp_path):
    with sqlite3.connect(tmp_path / "state.sqlite3") as db:
        db.execute(
            "CREATE TABLE devices (device_id TEXT PRIMARY KEY, token_sha256 TEXT NOT NULL, "
            "num_samples INTEGER NOT NULL, profile TEXT NOT NULL, registered_at REAL NOT NULL)"
        )
        db.execute("INSERT INTO devices VALUES ('old', ?, 5, '{}', 1.0)", (token_digest("old-token"),))
    db.close()
    store = Store(tmp_path)
    assert store.device_for_token("old-token") == "old"
    assert store.credentials("old").secret_sha256 == ""
    assert store.enrol_device("new", "s") and [d.device_id for d in store.devices()] == ["new", "old"]


def test_rounds_and_files_persist(tmp_path):
    store = Store(tmp_path)
    assert store.latest_round() is None
    store.save_round(_record(0), b"w0", b"o0", [])
    store.save_round(_record(1), b"w1", None, [UpdateRecord("dev-1", 10, 0.3, 1.5, "ef" * 32)])
    reopened = Store(tmp_path)
    assert reopened.latest_round() == _record(1)
    assert [r.round for r in reopened.rounds()] == [0, 1]
    assert reopened.model_path(1, "weights").read_bytes() == b"w1"
    assert reopened.updates(1)[0].device_id == "dev-1"


def test_a_round_is_never_stored_twice_nor_its_files_overwritten(tmp_path):
    store = Store(tmp_path)
    store.save_round(_record(1), b"w1", None, [])
    with pytest.raises(ValueError, match="round 1 is already stored"):
        store.save_round(_record(1), b"other weights", None, [])
    assert len(store.rounds()) == 1
    assert store.model_path(1, "weights").read_bytes() == b"w1"


@pytest.mark.parametrize(
    "content", [b"not a database at all, just text\n" * 10, b"SQLite format 3\x00" + b"\xff" * 2000]
)
def test_a_damaged_database_is_refused_never_reset(tmp_path, content):
    (tmp_path / "state.sqlite3").write_bytes(content)
    with pytest.raises(StateError) as refused:
        Store(tmp_path)
    message = str(refused.value)
    assert (
        str(tmp_path / "state.sqlite3") in message and "restore it" in message and "move it away" in message
    )
    assert "\n" not in message
    assert (tmp_path / "state.sqlite3").read_bytes() == content, "left as it was"


def test_a_coordinator_starting_removes_model_files_a_crash_left_half_written(tmp_path):
    store = Store(tmp_path / "state")
    half = store.models_dir / ".round-00003.safetensors.123.456.tmp"
    half.write_bytes(b"half")
    Store(tmp_path / "state")  # `fedspeech devices` beside a running coordinator leaves its writes alone
    assert half.exists()
    store.remove_unfinished_writes()
    assert not half.exists()


def test_a_state_directory_from_before_round_attendance_is_migrated(tmp_path):
    with sqlite3.connect(tmp_path / "state.sqlite3") as db:
        db.execute(
            "CREATE TABLE rounds (round INTEGER PRIMARY KEY, started_at REAL NOT NULL, "
            "finished_at REAL NOT NULL, wall_s REAL NOT NULL, devices INTEGER NOT NULL, "
            "results INTEGER NOT NULL, accuracy REAL, macro_f1 REAL, loss REAL, bytes_up INTEGER NOT NULL, "
            "bytes_down INTEGER NOT NULL, weights_sha256 TEXT NOT NULL, onnx_sha256 TEXT)"
        )
        db.execute("INSERT INTO rounds VALUES (0, 1.0, 2.0, 1.0, 0, 0, NULL, NULL, NULL, 0, 0, 'ab', NULL)")
    db.close()
    store = Store(tmp_path)
    old = store.latest_round()
    assert (old.round, old.withdrawn, old.stragglers) == (0, 0, 0)
    store.save_round(replace(_record(1), withdrawn=2, stragglers=1), b"w1", None, [])
    assert (store.latest_round().withdrawn, store.latest_round().stragglers) == (2, 1)


def test_the_database_is_read_and_written_by_its_owner_alone(tmp_path):
    """It holds the digests of every device's token and secret: 0600, whatever the umask, made or found."""
    old = os.umask(0o002)
    try:
        Store(tmp_path / "new").register_device("kitchen", "a-token", 10, {})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new" / DATABASE).stat().st_mode) == 0o600
    (tmp_path / "new" / DATABASE).chmod(0o644)  # a state folder from before, or a copy made carelessly
    Store(tmp_path / "new")
    assert stat.S_IMODE((tmp_path / "new" / DATABASE).stat().st_mode) == 0o600
