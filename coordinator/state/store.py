"""The coordinator's state directory: SQLite for devices, rounds and evaluations; its files by `folder`."""

import contextlib
import hashlib
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

from fedspeech.coordinator.state.folder import StateFiles, StateWriteError, pair_files, private_file
from fedspeech.coordinator.state.records import (
    CREDENTIAL_COLUMNS,
    DEVICE_COLUMNS,
    ROUND_COLUMNS,
    SCHEMA,
    SELECT_ROUNDS,
    CredentialDigests,
    DeviceEvaluation,
    DeviceRecord,
    RoundRecord,
    UpdateRecord,
    add_missing_columns,
    device_record,
)
from fedspeech.protocol.weights import sha256

# tokens of revoked devices, kept so that the device holding one can be told (the newest are kept)
MAX_REVOKED_TOKENS = 10_000
DATABASE = "state.sqlite3"


class StateError(ValueError):
    """The state directory cannot be used as it is; the text says which file and what to do."""


def holds_state(state_dir: Path) -> bool:
    """Whether a folder holds a coordinator's state: the database a coordinator or `devices add` made."""
    return (Path(state_dir) / DATABASE).is_file()


def token_digest(token: str) -> str:
    """What the store keeps of a bearer token or an enrolment secret: its sha256, never the text."""
    return hashlib.sha256(token.encode()).hexdigest()


class Store:
    """Devices, rounds and model files under one state directory; safe to share across threads."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir).resolve()  # Flask serves files relative to the package, not the cwd
        self.files = StateFiles(self.dir)
        self.models_dir = self.files.models_dir
        try:
            self.files.make_folders()
        except OSError as exc:
            raise StateError(f"cannot use the state directory {self.dir}: {exc.strerror}") from None
        self._db = self.dir / DATABASE
        with contextlib.suppress(OSError):  # a folder that takes no writes is refused by check_writable
            private_file(self._db)
        try:
            with self._connect() as db:
                if db.execute("PRAGMA quick_check").fetchone() != ("ok",):
                    raise sqlite3.DatabaseError("its integrity check failed")
                db.executescript(SCHEMA)
                add_missing_columns(db)
        except sqlite3.Error as exc:
            raise StateError(
                f"{self._db} cannot be used ({exc}): restore it from a backup, or move it away to start "
                "afresh (devices then register again and rounds start from 0)"
            ) from None

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self._db, timeout=30)
        try:
            with db:
                yield db
        finally:
            db.close()

    def check_writable(self) -> None:
        """StateError unless the state directory, its model folder and its database all take writes.

        A read-only mount or a folder of another user otherwise fails only at the first registration.
        """
        try:
            self.files.check_writable()
            with self._connect() as db:  # the same value written back: a write all the same
                version = db.execute("PRAGMA user_version").fetchone()[0]
                db.execute(f"PRAGMA user_version = {int(version)}")
        except (OSError, sqlite3.Error) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise StateError(
                f"cannot write the state directory {self.dir} ({why}): give a folder this user may write "
                "with --state, or make this one writable (a read-only mount, another user's folder?)"
            ) from None

    def remove_unfinished_writes(self) -> None:
        """Delete model files a crash left half-written, and relayed updates of rounds that never ended.

        Only while no coordinator runs on this state.
        """
        self.files.remove_unfinished_writes()

    def register_device(
        self,
        device_id: str,
        token: str,
        num_samples: int,
        profile: dict,
        test_counts: Mapping[str, int] | None = None,
        identity_key: str = "",
    ) -> None:
        """Add a device or replace its token, sample count, profile, test counts and identity key (base64;
        '' for none); an enrolment secret is kept. StateWriteError if the state does not take it (a full
        disk, a folder made read-only).
        """
        counts = json.dumps(dict(test_counts or {}))
        try:
            with self._connect() as db:
                db.execute(
                    "INSERT INTO devices (device_id, token_sha256, num_samples, profile, registered_at, "
                    "test_counts, identity_key) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (device_id) DO "
                    "UPDATE SET token_sha256 = excluded.token_sha256, num_samples = excluded.num_samples, "
                    "profile = excluded.profile, registered_at = excluded.registered_at, "
                    "test_counts = excluded.test_counts, identity_key = excluded.identity_key",
                    (
                        device_id,
                        token_digest(token),
                        num_samples,
                        json.dumps(profile),
                        time.time(),
                        counts,
                        identity_key,
                    ),  # fmt: skip
                )
        except sqlite3.OperationalError as exc:
            raise StateWriteError(
                f"could not store the registration of {device_id} in {self.dir}: {exc}"
            ) from None

    def enrol_device(self, device_id: str, secret: str) -> bool:
        """Add a device that may register with this secret; False if the id is taken."""
        try:
            with self._connect() as db:
                db.execute(
                    "INSERT INTO devices (device_id, token_sha256, num_samples, profile, registered_at, "
                    "secret_sha256) VALUES (?, '', 0, '{}', ?, ?)",
                    (device_id, time.time(), token_digest(secret)),
                )
        except sqlite3.IntegrityError:
            return False
        return True

    def delete_device(self, device_id: str) -> bool:
        """Forget a device and its enrolment, its token kept as revoked; False if there was none."""
        with self._connect() as db:
            row = db.execute("SELECT token_sha256 FROM devices WHERE device_id = ?", (device_id,)).fetchone()
            if row is None:
                return False
            if row[0]:
                db.execute(
                    "INSERT OR REPLACE INTO revoked_tokens VALUES (?, ?, ?)", (row[0], device_id, time.time())
                )
                db.execute(  # the newest MAX_REVOKED_TOKENS are kept
                    "DELETE FROM revoked_tokens WHERE token_sha256 NOT IN "
                    "(SELECT token_sha256 FROM revoked_tokens ORDER BY revoked_at DESC LIMIT ?)",
                    (MAX_REVOKED_TOKENS,),
                )
            db.execute("DELETE FROM devices WHERE device_id = ?", (device_id,))
        return True

    def revoked_device(self, token: str) -> str | None:
        """The device whose token this was when the operator revoked it, or None."""
        with self._connect() as db:
            row = db.execute(
                "SELECT device_id FROM revoked_tokens WHERE token_sha256 = ?", (token_digest(token),)
            ).fetchone()
        return row[0] if row else None

    def credentials(self, device_id: str) -> CredentialDigests | None:
        """The digests of a device's token and enrolment secret, or None for an unknown device."""
        with self._connect() as db:
            row = db.execute(
                f"SELECT {CREDENTIAL_COLUMNS} FROM devices WHERE device_id = ?", (device_id,)
            ).fetchone()
        return CredentialDigests(*row) if row else None

    def device_for_token(self, token: str) -> str | None:
        """The device a bearer token was issued to, or None."""
        # Looking up the token's sha256 leaks nothing usable about the token through timing.
        with self._connect() as db:
            row = db.execute(
                "SELECT device_id FROM devices WHERE token_sha256 = ?", (token_digest(token),)
            ).fetchone()
        return row[0] if row else None

    def devices(self) -> list[DeviceRecord]:
        """Every device known: registered, enrolled, or both."""
        with self._connect() as db:
            rows = db.execute(f"SELECT {DEVICE_COLUMNS} FROM devices ORDER BY device_id").fetchall()
        return [device_record(r) for r in rows]

    def device(self, device_id: str) -> DeviceRecord | None:
        """One device, or None."""
        with self._connect() as db:
            row = db.execute(
                f"SELECT {DEVICE_COLUMNS} FROM devices WHERE device_id = ?", (device_id,)
            ).fetchone()
        return device_record(row) if row else None

    def registered(self) -> set[str]:
        """The ids of the devices that hold a token."""
        with self._connect() as db:
            rows = db.execute("SELECT device_id FROM devices WHERE token_sha256 != ''").fetchall()
        return {r[0] for r in rows}

    def identity_keys(self, device_ids: Iterable[str]) -> dict[str, str]:
        """The identity keys (base64) the given devices registered, of those that registered one."""
        wanted = list(device_ids)
        with self._connect() as db:
            rows = db.execute(
                f"SELECT device_id, identity_key FROM devices WHERE identity_key != '' AND device_id IN "
                f"({','.join('?' * len(wanted))})",
                wanted,
            ).fetchall()
        return dict(rows)

    def count_devices(self) -> int:
        """How many devices the store knows."""
        with self._connect() as db:
            return db.execute("SELECT COUNT(*) FROM devices").fetchone()[0]

    def model_path(self, round: int, kind: str) -> Path:
        """Where a round's model file of this kind lives (StateFiles.model_path)."""
        return self.files.model_path(round, kind)

    def save_model_file(self, round: int, kind: str, data: bytes) -> None:
        """Add a file of a stored round's model; StateWriteError if the disk does not take it."""
        self.files.save_model_file(round, kind, data)

    def relay_path(self, round: int, step: int) -> Path:
        """Where an update relayed inside a round's group waits for the next device."""
        return self.files.relay_path(round, step)

    def save_relay(self, round: int, step: int, blob: bytes) -> None:
        """Keep an update for the next device of its group; StateWriteError if the disk does not take it."""
        self.files.save_relay(round, step, blob)

    def remove_relays(self, round: int) -> None:
        """Delete a round's relayed updates once the round is stored: devices' updates are kept no longer."""
        self.files.remove_relays(round)

    def save_round(
        self,
        record: RoundRecord,
        weights: bytes,
        onnx: bytes | None,
        updates: list[UpdateRecord],
        teacher: bytes | None = None,
        pair: tuple[bytes, bytes] | None = None,
    ) -> None:
        """Write the round's model files, then commit its record: a crash in between leaves no round.

        pair: the ONNX model's front-end and classifier graphs, whose digests the record holds.

        StateWriteError if the disk does not take them; the files and records of earlier rounds stay as
        they were. ValueError for a round that is already stored.
        """
        with self._connect() as db:
            stored = db.execute("SELECT 1 FROM rounds WHERE round = ?", (record.round,)).fetchone()
        if stored:
            raise ValueError(f"round {record.round} is already stored")
        given = {"weights": weights, "onnx": onnx, "teacher": teacher} | pair_files(pair)
        files = {kind: data for kind, data in given.items() if data is not None}
        columns = ROUND_COLUMNS
        try:
            self.files.write_model_files(record.round, files)
            with self._connect() as db:
                db.execute(
                    f"INSERT INTO rounds ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                    [getattr(record, c) for c in columns],
                )
                db.executemany(
                    "INSERT INTO updates VALUES (?, ?, ?, ?, ?, ?)",
                    [(record.round, *asdict(u).values()) for u in updates],
                )
        except (OSError, sqlite3.Error) as exc:
            # files of a round without a record: never served, and they take space
            self.files.remove_model_files(record.round, files)
            raise StateWriteError(f"could not store round {record.round} in {self.dir}: {exc}") from None

    def replace_onnx(
        self, record: RoundRecord, onnx: bytes, pair: tuple[bytes, bytes] | None = None
    ) -> RoundRecord:
        """Put new ONNX files in place of a stored round's (the same weights, new metadata): the one file and
        the pair (front-end and classifier; None removes the round's); the record with their digests.

        StateWriteError if the disk does not take them; then the round keeps its files and digests.
        """
        round = record.round
        files = {"onnx": onnx} | pair_files(pair)
        digests = {f"{kind}_sha256": None if data is None else sha256(data) for kind, data in files.items()}
        previous = self.files.read_model_files(round, files)
        try:
            self.files.write_model_files(round, files)
            with self._connect() as db:
                assignments = ", ".join(f"{column} = ?" for column in digests)
                db.execute(f"UPDATE rounds SET {assignments} WHERE round = ?", [*digests.values(), round])
        except (OSError, sqlite3.Error) as exc:
            with contextlib.suppress(OSError):
                self.files.write_model_files(round, previous)
            raise StateWriteError(f"could not store the new ONNX model of round {round}: {exc}") from None
        return replace(
            record,
            onnx_sha256=digests["onnx_sha256"],
            frontend_sha256=digests["frontend_sha256"],
            classifier_sha256=digests["classifier_sha256"],
        )

    def save_evaluation(
        self,
        round: int,
        asked: int,
        scores: tuple[float, float, float] | None,
        devices: list[DeviceEvaluation],
        summed: tuple[int, int] | None = None,
    ) -> None:
        """Record a round's federated evaluation: devices asked, their reports, the pooled scores or None.
        summed: (reports, clips) of an evaluation the coordinator learnt only as a sum, with no device's.

        StateWriteError if the disk does not take it.
        """
        reports = summed[0] if summed else len(devices)
        clips = summed[1] if summed else sum(d.clips for d in devices) if scores else None
        try:
            with self._connect() as db:
                db.execute(
                    "INSERT OR REPLACE INTO federated_evaluations (round, asked, reports, accuracy, "
                    "macro_f1, loss, clips) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (round, asked, reports, *(scores or (None, None, None)), clips),
                )
                db.executemany(
                    "INSERT OR REPLACE INTO device_evaluations VALUES (?, ?, ?, ?, ?)",
                    [(round, *asdict(d).values()) for d in devices],
                )
        except (OSError, sqlite3.Error) as exc:
            raise StateWriteError(
                f"could not store the evaluation of round {round} in {self.dir}: {exc}"
            ) from None

    def device_evaluations(self, round: int) -> list[DeviceEvaluation]:
        """Each device's evaluation of a round's model."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT device_id, clips, correct, loss_sum FROM device_evaluations WHERE round = ? "
                "ORDER BY device_id",
                (round,),
            ).fetchall()
        return [DeviceEvaluation(*r) for r in rows]

    def rounds(self) -> list[RoundRecord]:
        """All completed rounds in order."""
        with self._connect() as db:
            rows = db.execute(f"{SELECT_ROUNDS} ORDER BY r.round").fetchall()
        return [RoundRecord(*row) for row in rows]

    def latest_round(self) -> RoundRecord | None:
        """The last completed round, or None before the first."""
        with self._connect() as db:
            row = db.execute(f"{SELECT_ROUNDS} ORDER BY r.round DESC LIMIT 1").fetchone()
        return RoundRecord(*row) if row else None

    def last_counted(self) -> dict[str, int]:
        """The samples each device's latest aggregated update counted for."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT u.device_id, u.num_samples FROM updates u JOIN (SELECT device_id, MAX(round) AS "
                "round FROM updates GROUP BY device_id) latest USING (device_id, round)"
            ).fetchall()
        return dict(rows)

    def rounds_joined(self) -> dict[str, int]:
        """How many rounds' models each device's updates went into."""
        with self._connect() as db:
            rows = db.execute("SELECT device_id, COUNT(*) FROM updates GROUP BY device_id").fetchall()
        return dict(rows)

    def updates(self, round: int) -> list[UpdateRecord]:
        """The updates aggregated into a round."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT device_id, num_samples, train_loss, train_seconds, sha256 FROM updates "
                "WHERE round = ? ORDER BY device_id",
                (round,),
            ).fetchall()
        return [UpdateRecord(*r) for r in rows]
