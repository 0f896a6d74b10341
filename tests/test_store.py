"""The coordinator's state directory: devices, tokens, rounds and model files survive a reopen."""

import sqlite3

import pytest

from fedspeech.coordinator.store import RoundRecord, Store, UpdateRecord


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


def test_a_round_is_never_stored_twice(tmp_path):
    store = Store(tmp_path)
    store.save_round(_record(1), b"w1", None, [])
    with pytest.raises(sqlite3.IntegrityError):
        store.save_round(_record(1), b"w1", None, [])
    assert len(store.rounds()) == 1
