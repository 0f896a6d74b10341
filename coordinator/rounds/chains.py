"""The groups of grouped sequential training: who trains next in each group, and the group's model so far."""

from dataclasses import dataclass, field

from fedspeech.coordinator.strategies import Result
from fedspeech.protocol.messages import BlobRef


@dataclass
class Chain:
    """One group's devices in training order; each starts from the last good model before it."""

    devices: list[str]
    position: int = 0
    last: Result | None = None  # the last update accepted in the group
    last_ref: BlobRef | None = None  # where the next device downloads it (None: the global model)
    samples: int = 0  # samples the accepted updates trained on
    skipped: list[str] = field(default_factory=list)

    @property
    def current(self) -> str | None:
        """The device training now, None once the group is through."""
        return self.devices[self.position] if self.position < len(self.devices) else None

    def advance(self, result: Result | None, ref: BlobRef | None = None) -> None:
        """Move to the next device: past the current one's update (and where it is served), or skipping it."""
        device = self.current
        if device is None:
            raise ValueError("the group is through")
        if result is None:
            self.skipped.append(device)  # the next device starts from the last good model
        else:
            if result.device_id != device:
                raise ValueError(f"an update of {result.device_id} while {device} trains")
            self.last, self.last_ref, self.samples = result, ref, self.samples + result.num_samples
        self.position += 1

    def result(self) -> Result | None:
        """The group's model, counted for all the samples it was trained on; None if nobody answered."""
        if self.current is not None or self.last is None:
            return None
        return Result(self.last.device_id, self.last.arrays, self.samples)
