"""The coordinator's state directory: SQLite for devices and rounds, safetensors and ONNX model files."""

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from fedspeech.coordinator.evaluation import DeviceEvaluation
from fedspeech.protocol.files import write_atomically

SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL,
    num_samples INTEGER NOT NULL,
    profile TEXT NOT NULL,
    registered_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    wall_s REAL NOT NULL,
    devices INTEGER NOT NULL,
    results INTEGER NOT NULL,
    accuracy REAL,
    macro_f1 REAL,
    loss REAL,
    bytes_up INTEGER NOT NULL,
    bytes_down INTEGER NOT NULL,
    weights_sha256 TEXT NOT NULL,
    onnx_sha256 TEXT
);
CREATE TABLE IF NOT EXISTS updates (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    num_samples INTEGER NOT NULL,
    train_loss REAL,
    train_seconds REAL,
    sha256 TEXT NOT NULL,
    PRIMARY KEY (round, device_id)
);
CREATE TABLE IF NOT EXISTS federated_evaluations (
    round INTEGER PRIMARY KEY,
    asked INTEGER NOT NULL,
    reports INTEGER NOT NULL,
    accuracy REAL,
    macro_f1 REAL,
    loss REAL
);
CREATE TABLE IF NOT EXISTS device_evaluations (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    clips INTEGER NOT NULL,
    correct INTEGER NOT NULL,
    loss_sum REAL NOT NULL,
    PRIMARY KEY (round, device_id)
);
"""


@dataclass(frozen=True)
class RoundRecord:
    """One completed round as stored: when, who, how well, how many bytes, which model."""

    round: int
    started_at: float
    finished_at: float
    wall_s: float
    devices: int
    results: int
    accuracy: float | None
    macro_f1: float | None
    loss: float | None
    bytes_up: int
    bytes_down: int
    weights_sha256: str
    onnx_sha256: str | None = None
    # federated evaluation: devices asked and reporting, and their pooled scores (None: too few reports)
    evaluation_asked: int | None = None  # None: the round's model was not evaluated on the devices
    evaluation_reports: int | None = None
    federated_accuracy: float | None = None
    federated_macro_f1: float | None = None
    federated_loss: float | None = None


@dataclass(frozen=True)
class UpdateRecord:
    """One accepted device update of a completed round."""

    device_id: str
    num_samples: int
    train_loss: float | None
    train_seconds: float | None
    sha256: str


@dataclass(frozen=True)
class DeviceRecord:
    """A registered device."""

    device_id: str
    num_samples: int
    profile: dict
    registered_at: float


# the rounds table holds what training produced; the federated evaluation is joined from its own table
_ROUND_COLUMNS = [f.name for f in fields(RoundRecord) if not f.name.startswith(("evaluation_", "federated_"))]
_SELECT_ROUNDS = (
    f"SELECT {', '.join('r.' + c for c in _ROUND_COLUMNS)}, "
    "f.asked, f.reports, f.accuracy, f.macro_f1, f.loss "
    "FROM rounds r LEFT JOIN federated_evaluations f ON f.round = r.round"
)


def token_digest(token: str) -> str:
    """What the store keeps of a bearer token: its sha256, never the token."""
    return hashlib.sha256(token.encode()).hexdigest()


class Store:
    """Devices, rounds and model files under one state directory; safe to share across threads."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir).resolve()  # Flask serves files relative to the package, not the cwd
        self.models_dir = self.dir / "models"
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self._db = self.dir / "state.sqlite3"
        with self._connect() as db:
            db.executescript(SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self._db, timeout=30)
        try:
            with db:
                yield db
        finally:
            db.close()

    def register_device(self, device_id: str, token: str, num_samples: int, profile: dict) -> None:
        """Add a device or replace its token, sample count and profile."""
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO devices VALUES (?, ?, ?, ?, ?)",
                (device_id, token_digest(token), num_samples, json.dumps(profile), time.time()),
            )

    def device_for_token(self, token: str) -> str | None:
        """The device a bearer token was issued to, or None."""
        # Looking up the token's sha256 leaks nothing usable about the token through timing.
        with self._connect() as db:
            row = db.execute(
                "SELECT device_id FROM devices WHERE token_sha256 = ?", (token_digest(token),)
            ).fetchone()
        return row[0] if row else None

    def devices(self) -> list[DeviceRecord]:
        """All registered devices."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT device_id, num_samples, profile, registered_at FROM devices ORDER BY device_id"
            ).fetchall()
        return [DeviceRecord(r[0], r[1], json.loads(r[2]), r[3]) for r in rows]

    def model_path(self, round: int, kind: str) -> Path:
        """Where the global model of a round lives: kind 'weights' (safetensors) or 'onnx'."""
        suffix = {"weights": "safetensors", "onnx": "onnx"}[kind]
        return self.models_dir / f"round-{round:05d}.{suffix}"

    def save_round(
        self, record: RoundRecord, weights: bytes, onnx: bytes | None, updates: list[UpdateRecord]
    ) -> None:
        """Write the round's model files, then commit its record: a crash in between leaves no round."""
        write_atomically(self.model_path(record.round, "weights"), weights)
        if onnx is not None:
            write_atomically(self.model_path(record.round, "onnx"), onnx)
        columns = _ROUND_COLUMNS
        with self._connect() as db:
            db.execute(
                f"INSERT INTO rounds ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                [getattr(record, c) for c in columns],
            )
            db.executemany(
                "INSERT INTO updates VALUES (?, ?, ?, ?, ?, ?)",
                [(record.round, *asdict(u).values()) for u in updates],
            )

    def save_evaluation(
        self,
        round: int,
        asked: int,
        scores: tuple[float, float, float] | None,
        devices: list[DeviceEvaluation],
    ) -> None:
        """Record a round's federated evaluation: devices asked, their reports, the pooled scores or None."""
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO federated_evaluations VALUES (?, ?, ?, ?, ?, ?)",
                (round, asked, len(devices), *(scores or (None, None, None))),
            )
            db.executemany(
                "INSERT OR REPLACE INTO device_evaluations VALUES (?, ?, ?, ?, ?)",
                [(round, *asdict(d).values()) for d in devices],
            )

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
            rows = db.execute(f"{_SELECT_ROUNDS} ORDER BY r.round").fetchall()
        return [RoundRecord(*row) for row in rows]

    def latest_round(self) -> RoundRecord | None:
        """The last completed round, or None before the first."""
        with self._connect() as db:
            row = db.execute(f"{_SELECT_ROUNDS} ORDER BY r.round DESC LIMIT 1").fetchone()
        return RoundRecord(*row) if row else None

    def updates(self, round: int) -> list[UpdateRecord]:
        """The updates aggregated into a round."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT device_id, num_samples, train_loss, train_seconds, sha256 FROM updates "
                "WHERE round = ? ORDER BY device_id",
                (round,),
            ).fetchall()
        return [UpdateRecord(*r) for r in rows]
