"""The record of one benchmark run: its rounds as the coordinator stored them, and what they add up to."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedspeech.coordinator.state.records import RoundRecord


@dataclass(frozen=True)
class Run:
    """One training run: its rounds as stored, times counted from t0, the start of its first round."""

    corpus: str
    arm: str
    seed: int
    rounds: list[RoundRecord]
    t0: float

    @property
    def accuracies(self) -> list[float]:
        """Each round's accuracy: pooled over the devices where they evaluated, else the coordinator's."""
        return [_accuracy(r) for r in self.rounds]

    @property
    def final_accuracy(self) -> float:
        """Accuracy of the last global model."""
        return self.accuracies[-1]

    @property
    def wall_s(self) -> float:
        """Seconds from start to the last round's end."""
        return self.rounds[-1].finished_at - self.t0

    @property
    def bytes_total(self) -> int:
        """Bytes up plus bytes down over all rounds."""
        return sum(r.bytes_up + r.bytes_down for r in self.rounds)

    def time_to(self, target: float) -> float | None:
        """Seconds until the global model first reached the target accuracy, or None."""
        return next((r.finished_at - self.t0 for r in self.rounds if _accuracy(r) >= target), None)

    def bytes_to(self, target: float) -> int | None:
        """Bytes up and down until the global model first reached the target accuracy, or None."""
        moved = 0
        for r in self.rounds:
            moved += r.bytes_up + r.bytes_down
            if _accuracy(r) >= target:
                return moved
        return None

    def rounds_to(self, target: float) -> int | None:
        """The first round whose global model reached the target accuracy, or None."""
        return next((r.round for r in self.rounds if _accuracy(r) >= target), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Run":
        """A run back from its dataclasses.asdict form (as results.json holds it)."""
        rounds = [RoundRecord(**record) for record in data["rounds"]]
        return cls(data["corpus"], data["arm"], int(data["seed"]), rounds, float(data["t0"]))


def _accuracy(record: RoundRecord) -> float:
    """A round's accuracy pooled over the devices' test clips where they evaluated, else centrally.

    Devices evaluate only where an arm asks them to: FedBN's personalised models exist only there.
    """
    accuracy = record.federated_accuracy if record.federated_accuracy is not None else record.accuracy
    if accuracy is None:
        raise ValueError(f"round {record.round} has no accuracy: give the run a held-out set")
    return accuracy
