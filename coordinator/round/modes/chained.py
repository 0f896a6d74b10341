"""The chained round mode, grouped sequential training's: the devices of each group train one after
another, each from the last good update before it; groups run side by side, and the round is over when
every group is through. A device has ROUND_TIMEOUT_S from its task: one that has not answered by then,
went offline or said it could not do its task, is skipped, and its group goes on from the last good model.
"""

import logging
import time
from dataclasses import dataclass, field, replace

from fedspeech.coordinator.round.modes.base import Collected, RoundContext
from fedspeech.coordinator.round.open_round import OpenRound
from fedspeech.coordinator.state.store import Store
from fedspeech.coordinator.strategies import Result, RoundPlan
from fedspeech.protocol import routes, weights
from fedspeech.protocol.messages import BlobRef
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)


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


def train(round: int, plan: RoundPlan, context: RoundContext) -> Collected:
    """The plan's groups trained side by side, each device after the one before; a result per group."""
    chains = [Chain(list(group)) for group in plan.groups]
    # every device's update is taken: each is where the next one in its group starts
    context.uploads.open(OpenRound(round, context.started, context.started, {}, len(plan.work), frozenset()))
    _train_in_groups(round, chains, context)
    closed, _ = context.uploads.close()
    for chain in chains:
        if chain.current is not None:  # stopped while it trained
            context.link.clear_task(chain.current)
    results = [r for c in chains if (r := c.result()) is not None]
    # a group's result stands for every update of the group
    stands_for = {c.last.device_id: c.devices for c in chains if c.last is not None}
    return Collected(closed, results, any(c.skipped for c in chains), stands_for)


def _train_in_groups(round: int, chains: list[Chain], context: RoundContext) -> None:
    """Run the open round's groups side by side until every group is through or stop is set."""
    for chain in chains:
        _hand_out(round, chain, context)
    step = 0
    while not context.stop.is_set() and any(c.current is not None for c in chains):
        answered, late = context.uploads.poll([d for c in chains if (d := c.current) is not None])
        done = [(c, answered[d]) for c in chains if (d := c.current) is not None and d in answered]
        skipped = [(c, d) for c in chains if (d := c.current) is not None and d in late]
        for chain, device in skipped:
            chain.advance(None)
            log.warning("round %d: %s did not answer in time: its group goes on without it", round, device)
            context.link.clear_task(device)
            _hand_out(round, chain, context)
        for chain, result in done:
            context.link.clear_task(result.device_id)
            step += 1
            chain.advance(result, _relay(context.store, round, step, result.arrays))
            _hand_out(round, chain, context)


def _hand_out(round: int, chain: Chain, context: RoundContext) -> None:
    """Send the group's current device its task, due ROUND_TIMEOUT_S from now, from the group's last good
    model.
    """
    device = chain.current
    if device is None:
        return
    task = context.tasks([device], time.time() + context.config.round_timeout)[device]
    if chain.last is not None and chain.last_ref is not None:
        task = replace(task, weights=chain.last_ref)
        log.info("round %d: %s trains from the update of %s", round, device, chain.last.device_id)
    context.uploads.add_task(device, task)
    context.link.publish_task(task, device)


def _relay(store: Store, round: int, step: int, arrays: Arrays) -> BlobRef:
    """Store an update for the next device of its group; where that device downloads it."""
    blob = weights.encode(arrays, metadata={"round": str(round)})
    store.save_relay(round, step, blob)
    return BlobRef(routes.relay(round, step), weights.sha256(blob), len(blob))
