"""The coordinator's own clips as a strategy sees them: scoring an update, distilling a server model."""

from collections.abc import Callable
from dataclasses import dataclass

from fedspeech.coordinator.config import RoundConfig
from fedspeech.coordinator.round.interfaces import ModelOps
from fedspeech.protocol.weights import Arrays


@dataclass(frozen=True)
class CoordinatorClips:
    """strategies.ServerSide on the global model's operations and the rounds' settings."""

    model: ModelOps
    config: RoundConfig
    complete: Callable[[Arrays], Arrays]  # the arrays devices send, with the layers a method keeps local
    learning_rate: Callable[[int], float]  # the devices' learning rate in a round

    def score(self, arrays: Arrays) -> float | None:
        """An update's accuracy on the validation set; None while there are no clips."""
        return self.model.score(self.complete(arrays))

    def distil(self, student: Arrays, teacher: Arrays, temperature: float, round: int) -> Arrays:
        """The student trained on the server's clips towards the teacher, with the round's settings."""
        c = self.config
        return self.model.distil(
            student,
            teacher,
            epochs=c.epochs,
            batch_size=c.batch_size,
            learning_rate=self.learning_rate(round),
            temperature=temperature,
            seed=c.seed * 100_003 + round,
        )
