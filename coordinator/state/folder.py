"""The files of the coordinator's state folder: each round's model files and the updates relayed inside a
round; where they live, written atomically, removed once unfinished or no longer needed."""

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from fedspeech.protocol.files import write_atomically

PAIR_KINDS = ("frontend", "classifier")  # the ONNX model's two graphs, as model_path names them
SUFFIXES = {  # a round's model files by kind, as model_path names them
    "weights": "safetensors",
    "float16": "float16.safetensors",
    "onnx": "onnx",
    "teacher": "teacher.safetensors",
    "frontend": "frontend.onnx",
    "classifier": "classifier.onnx",
}


def pair_files(pair: tuple[bytes, bytes] | None) -> dict[str, bytes | None]:
    """The ONNX model's two graphs by kind, front-end then classifier; None for each without a pair."""
    return dict(zip(PAIR_KINDS, pair or (None, None), strict=True))


class StateWriteError(Exception):
    """The state directory did not take a write (a full disk, a read-only folder); nothing half written."""


class StateFiles:
    """The model files and relayed updates under one state folder; safe to share across threads."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.models_dir = self.dir / "models"
        self.relays_dir = self.dir / "relays"

    def make_folders(self) -> None:
        """Create the state folder and its model folder if missing; OSError if they cannot be."""
        self.models_dir.mkdir(parents=True, exist_ok=True)

    def check_writable(self) -> None:
        """OSError unless the state folder and its model folder both take a file."""
        for folder in (self.dir, self.models_dir):
            probe = folder / ".write-check"
            write_atomically(probe, b"")
            probe.unlink(missing_ok=True)  # another writer may have removed it first

    def remove_unfinished_writes(self) -> None:
        """Delete model files a crash left half-written, and relayed updates of rounds that never ended.

        Only while no coordinator runs on this state.
        """
        for unfinished in self.models_dir.glob(".round-*.tmp"):
            unfinished.unlink(missing_ok=True)
        shutil.rmtree(self.relays_dir, ignore_errors=True)

    def model_path(self, round: int, kind: str) -> Path:
        """Where a round's model lives: kind weights (safetensors), float16 (in half), onnx, teacher, or the
        ONNX model's two graphs, frontend and classifier.
        """
        return self.models_dir / f"round-{round:05d}.{SUFFIXES[kind]}"

    def save_model_file(self, round: int, kind: str, data: bytes) -> None:
        """Add a file of a stored round's model (model_path); StateWriteError if the disk does not take it."""
        try:
            write_atomically(self.model_path(round, kind), data)
        except OSError as exc:
            raise StateWriteError(f"could not store the {kind} of round {round}: {exc}") from None

    def write_model_files(self, round: int, files: Mapping[str, bytes | None]) -> None:
        """Write a round's model files by kind, each atomically and in order, None removing that kind's file;
        OSError if the disk does not take one (those before it are written).
        """
        for kind, data in files.items():
            if data is None:
                self.model_path(round, kind).unlink(missing_ok=True)
            else:
                write_atomically(self.model_path(round, kind), data)

    def read_model_files(self, round: int, kinds: Iterable[str]) -> dict[str, bytes]:
        """The content of those of a round's model files of these kinds that exist, by kind."""
        paths = {kind: self.model_path(round, kind) for kind in kinds}
        return {kind: path.read_bytes() for kind, path in paths.items() if path.exists()}

    def remove_model_files(self, round: int, kinds: Iterable[str]) -> None:
        """Delete a round's model files of these kinds, those that exist."""
        for kind in kinds:
            self.model_path(round, kind).unlink(missing_ok=True)

    def relay_path(self, round: int, step: int) -> Path:
        """Where an update relayed inside a round's group waits for the next device."""
        return self.relays_dir / f"round-{round:05d}" / f"step-{step:05d}.safetensors"

    def save_relay(self, round: int, step: int, blob: bytes) -> None:
        """Keep an update for the next device of its group; StateWriteError if the disk does not take it."""
        path = self.relay_path(round, step)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, blob)
        except OSError as exc:
            raise StateWriteError(f"could not store a relayed update of round {round}: {exc}") from None

    def remove_relays(self, round: int) -> None:
        """Delete a round's relayed updates once the round is stored: devices' updates are kept no longer."""
        shutil.rmtree(self.relay_path(round, 0).parent, ignore_errors=True)


def private_file(path: Path) -> None:
    """Make path a file only its owner reads and writes (0600), creating it empty if it is missing.

    The database holds the digests of devices' tokens and secrets; SQLite gives its journal files the
    database's own mode.
    """
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
