"""Grouped sequential training (the chained round mode): each group's devices train one after another."""

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from fedspeech.coordinator.inbox import Inbox
from fedspeech.coordinator.ports import DeviceLink
from fedspeech.coordinator.rounds.chains import Chain
from fedspeech.coordinator.store import Store
from fedspeech.protocol import routes, weights
from fedspeech.protocol.messages import BlobRef, Task
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)

TaskMaker = Callable[[str], Task]  # a device's training task, due ROUND_TIMEOUT_S from now


def train_in_groups(
    round: int,
    chains: list[Chain],
    inbox: Inbox,
    link: DeviceLink,
    store: Store,
    make_task: TaskMaker,
    stop: threading.Event,
) -> None:
    """Run the open round's groups side by side until every group is through or stop is set.

    A device has ROUND_TIMEOUT_S from its task; one that has not answered by then, or went offline,
    is skipped. The caller opens and closes the round in the inbox.
    """
    for chain in chains:
        _hand_out(round, chain, inbox, link, make_task)
    step = 0
    while not stop.is_set() and any(c.current is not None for c in chains):
        answered, late = inbox.poll([d for c in chains if (d := c.current) is not None])
        done = [(c, answered[d]) for c in chains if (d := c.current) is not None and d in answered]
        skipped = [(c, d) for c in chains if (d := c.current) is not None and d in late]
        for chain, device in skipped:
            chain.advance(None)
            log.warning("round %d: %s did not answer in time: its group goes on without it", round, device)
            link.clear_task(device)
            _hand_out(round, chain, inbox, link, make_task)
        for chain, result in done:
            link.clear_task(result.device_id)
            step += 1
            chain.advance(result, _relay(store, round, step, result.arrays))
            _hand_out(round, chain, inbox, link, make_task)


def _hand_out(round: int, chain: Chain, inbox: Inbox, link: DeviceLink, make_task: TaskMaker) -> None:
    """Send the group's current device its task, from the group's last good model."""
    device = chain.current
    if device is None:
        return
    task = make_task(device)
    if chain.last is not None and chain.last_ref is not None:
        task = replace(task, weights=chain.last_ref)
        log.info("round %d: %s trains from the update of %s", round, device, chain.last.device_id)
    inbox.add_task(device, task)
    link.publish_task(task, device)


def _relay(store: Store, round: int, step: int, arrays: Arrays) -> BlobRef:
    """Store an update for the next device of its group; where that device downloads it."""
    blob = weights.encode(arrays, metadata={"round": str(round)})
    store.save_relay(round, step, blob)
    return BlobRef(routes.relay(round, step), weights.sha256(blob), len(blob))
