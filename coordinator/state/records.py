"""What the coordinator's state database holds: its tables, and the records the store reads from them."""

import json
import sqlite3
from dataclasses import dataclass, field, fields

# token_sha256 and secret_sha256 are '' where a device has none: enrolled but not registered yet, or
# registered under open enrolment without a secret
SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL,
    num_samples INTEGER NOT NULL,
    profile TEXT NOT NULL,
    registered_at REAL NOT NULL,
    secret_sha256 TEXT NOT NULL DEFAULT '',
    test_counts TEXT NOT NULL DEFAULT '{}',
    identity_key TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS revoked_tokens (
    token_sha256 TEXT PRIMARY KEY,
    device_id TEXT NOT NULL,
    revoked_at REAL NOT NULL
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
    onnx_sha256 TEXT,
    withdrawn INTEGER NOT NULL DEFAULT 0,
    stragglers INTEGER NOT NULL DEFAULT 0,
    dp_epsilon REAL,
    dp_delta REAL,
    frontend_sha256 TEXT,
    classifier_sha256 TEXT
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
    loss REAL,
    clips INTEGER
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
    # devices selected whose update is not in the round: gone offline during it, or still online but late
    withdrawn: int = 0
    stragglers: int = 0
    # differential privacy spent once this round's model is out: epsilon at delta (None: no guarantee)
    dp_epsilon: float | None = None
    dp_delta: float | None = None
    # the ONNX model as two graphs, front-end and classifier (None: stored as one file only)
    frontend_sha256: str | None = None
    classifier_sha256: str | None = None
    # federated evaluation: devices asked and reporting, and their pooled scores (None: too few reports)
    evaluation_asked: int | None = None  # None: the round's model was not evaluated on the devices
    evaluation_reports: int | None = None
    federated_accuracy: float | None = None
    federated_macro_f1: float | None = None
    federated_loss: float | None = None
    evaluation_clips: int | None = None  # the test clips the federated scores rest on


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
    """A device the coordinator knows: registered (it holds a token), enrolled by the operator, or both."""

    device_id: str
    num_samples: int
    profile: dict
    registered_at: float  # of its latest registration, or of its enrolment before it registered
    registered: bool  # it holds a token
    enrolled: bool  # the operator gave it an enrolment secret
    test_counts: dict[str, int] = field(default_factory=dict)  # its test clips per label, as registered


@dataclass(frozen=True)
class CredentialDigests:
    """What the store keeps of a device's credentials: sha256 digests and its identity key, '' for none."""

    token_sha256: str
    secret_sha256: str
    identity_key: str = ""
    registered_at: float = 0.0  # when its token was issued (or its secret, before it registered)


CREDENTIAL_COLUMNS = ", ".join(f.name for f in fields(CredentialDigests))


# the rounds table holds what training produced; the federated evaluation is joined from its own table
ROUND_COLUMNS = [f.name for f in fields(RoundRecord) if not f.name.startswith(("evaluation_", "federated_"))]
SELECT_ROUNDS = (
    f"SELECT {', '.join('r.' + c for c in ROUND_COLUMNS)}, "
    "f.asked, f.reports, f.accuracy, f.macro_f1, f.loss, f.clips "
    "FROM rounds r LEFT JOIN federated_evaluations f ON f.round = r.round"
)


# columns added since the first release, for state directories made before them
_ADDED_COLUMNS = {
    "devices": {
        "secret_sha256": "TEXT NOT NULL DEFAULT ''",
        "test_counts": "TEXT NOT NULL DEFAULT '{}'",
        "identity_key": "TEXT NOT NULL DEFAULT ''",
    },
    "rounds": {
        "withdrawn": "INTEGER NOT NULL DEFAULT 0",
        "stragglers": "INTEGER NOT NULL DEFAULT 0",
        "dp_epsilon": "REAL",
        "dp_delta": "REAL",
        "frontend_sha256": "TEXT",
        "classifier_sha256": "TEXT",
    },
    "federated_evaluations": {"clips": "INTEGER"},
}


def add_missing_columns(db: sqlite3.Connection) -> None:
    """Add the columns a state directory made before them lacks."""
    for table, added in _ADDED_COLUMNS.items():
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for name, definition in added.items():
            if name not in columns:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")


DEVICE_COLUMNS = (
    "device_id, num_samples, profile, registered_at, token_sha256 != '', secret_sha256 != '', test_counts"
)


def device_record(row: tuple) -> DeviceRecord:
    """The record of a device from a row of DEVICE_COLUMNS."""
    return DeviceRecord(
        row[0], row[1], json.loads(row[2]), row[3], bool(row[4]), bool(row[5]), json.loads(row[6])
    )


@dataclass(frozen=True)
class DeviceEvaluation:
    """One device's report: its confusion matrix (true class by row) and summed loss, and its accuracy."""

    device_id: str
    clips: int
    correct: int
    loss_sum: float

    @property
    def accuracy(self) -> float:
        """Correct over clips on this device."""
        return self.correct / self.clips
