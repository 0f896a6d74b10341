"""Devices that take their task and send nothing: asked less, the more rounds in a row they let pass.

A device that acknowledges a task and never uploads costs its round the stragglers' grace. Once may be
a network's fault; one that does so round after round is asked less: after n such rounds in a row it
sits out the next n - 1 (at most MOST_SAT_OUT), and one update it sends sets it straight. Devices that
went offline, or never took their task, are not stragglers: they were not there.
"""

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

MOST_SAT_OUT = 8  # rounds


@dataclass
class Stragglers:
    """Each straggler's rounds let pass in a row, and the round it is asked again from."""

    in_a_row: dict[str, int] = field(default_factory=dict)
    asked_again: dict[str, int] = field(default_factory=dict)

    def sitting_out(self, round: int, devices: Iterable[str]) -> set[str]:
        """Those of the devices that sit this round out."""
        return {d for d in devices if self.asked_again.get(d, 0) > round}

    def after(self, round: int, stragglers: Collection[str], answered: Collection[str]) -> None:
        """Count the round's stragglers; a device that answered starts afresh."""
        for device in answered:
            self.in_a_row.pop(device, None)
            self.asked_again.pop(device, None)
        for device in stragglers:
            self.in_a_row[device] = self.in_a_row.get(device, 0) + 1
            self.asked_again[device] = round + min(self.in_a_row[device], MOST_SAT_OUT + 1)
