"""Which device sent a change it did not bound, told from the secure sums: the coordinator sees only each
round's sum, and a sum longer than bounded changes can give says that one of its devices lied, not which.

After a refused sum, each next secure round leaves one of the refused sum's devices out in turn (the
rounds are run again anyway); the first round that passes without one names it, and it sits out the
next rounds, twice as many each time it is named. A sum of the others alone is no smaller a group than a
round a device drops out of, so this tells the coordinator nothing more of any one device's change.
"""

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class SumSuspects:
    """The devices that may have sent an unbounded change, and those named and sitting out for it."""

    suspects: list[str] = field(default_factory=list)  # the last refused sum's devices not yet cleared
    trying: str | None = None  # the suspect left out of the round being run
    until: dict[str, int] = field(default_factory=dict)  # a named device -> the last round it sits out
    named: dict[str, int] = field(default_factory=dict)  # a device -> the times it was named

    def aside(self, round: int, devices: list[str]) -> set[str]:
        """The devices kept out of this round's sum: those sitting out, and the suspect tried next."""
        out = {d for d in devices if self.until.get(d, 0) >= round}
        self.trying = next((d for d in self.suspects if d in devices and d not in out), None)
        return out | ({self.trying} if self.trying is not None else set())

    def refused(self, summed: list[str]) -> None:
        """A sum of these devices was too long: one of them lied (the one left out did not, alone)."""
        self.suspects = [d for d in (self.suspects or sorted(summed)) if d in summed]

    def passed(self, round: int) -> str | None:
        """A sum passed: the suspect left out of it is named and sits out; the suspects are cleared."""
        named, self.trying, self.suspects = self.trying, None, []
        if named is not None:
            self.named[named] = self.named.get(named, 0) + 1
            self.until[named] = round + 2 ** self.named[named]
            log.warning(
                "round %d: the secure sum passed without %s after sums with it were too long: it sent a "
                "change it did not bound, and sits out rounds %d to %d",
                round, named, round + 1, self.until[named],
            )  # fmt: skip
        return named
