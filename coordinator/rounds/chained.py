"""Grouped sequential training (the chained round mode): each group's devices train one after another."""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from fedspeech.coordinator.errors import NotWanted
from fedspeech.coordinator.open_round import OpenRound
from fedspeech.coordinator.ports import DeviceLink
from fedspeech.coordinator.rounds.chains import Chain
from fedspeech.coordinator.store import Store
from fedspeech.coordinator.strategies import Result
from fedspeech.protocol import routes, weights
from fedspeech.protocol.messages import BlobRef, Task
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)

TaskMaker = Callable[[str], Task]  # a device's training task, due ROUND_TIMEOUT_S from now


def train_in_groups(
    open_: OpenRound,
    lock: threading.Condition,
    link: DeviceLink,
    store: Store,
    make_task: TaskMaker,
    stop: threading.Event,
) -> None:
    """Run the open round's groups side by side until every group is through or stop is set.

    A device has ROUND_TIMEOUT_S from its task; one that has not answered by then, or went offline,
    is skipped. The caller opens and closes the round, under the lock it passes.
    """
    chains = open_.chains
    for chain in chains:
        _hand_out(open_, chain, lock, link, make_task)
    step = 0
    while not stop.is_set() and any(c.current is not None for c in chains):
        done: list[tuple[Chain, Result]] = []
        skipped: list[tuple[Chain, str]] = []
        with lock:
            lock.wait(timeout=0.25)
            online = set(link.online())
            for chain in chains:
                device = chain.current
                if device is None:
                    continue
                if device in open_.updates:
                    done.append((chain, open_.updates[device][0]))
                elif time.time() > open_.tasks[device].deadline or device not in online:
                    chain.advance(None)  # under the lock: its update is not wanted from now on
                    skipped.append((chain, device))
        for chain, device in skipped:
            log.warning(
                "round %d: %s did not answer in time: its group goes on without it", open_.round, device
            )
            link.clear_task(device)
            _hand_out(open_, chain, lock, link, make_task)
        for chain, result in done:
            link.clear_task(result.device_id)
            step += 1
            chain.advance(result, _relay(store, open_.round, step, result.arrays))
            _hand_out(open_, chain, lock, link, make_task)


def _hand_out(
    open_: OpenRound, chain: Chain, lock: threading.Condition, link: DeviceLink, make_task: TaskMaker
) -> None:
    """Send the group's current device its task, from the group's last good model."""
    device = chain.current
    if device is None:
        return
    task = make_task(device)
    if chain.last is not None and chain.last_ref is not None:
        task = replace(task, weights=chain.last_ref)
        log.info("round %d: %s trains from the update of %s", open_.round, device, chain.last.device_id)
    with lock:
        open_.tasks[device] = task
        open_.deadline = max(open_.deadline, task.deadline)
    link.publish_task(task, device)


def _relay(store: Store, round: int, step: int, arrays: Arrays) -> BlobRef:
    """Store an update for the next device of its group; where that device downloads it."""
    blob = weights.encode(arrays, metadata={"round": str(round)})
    store.save_relay(round, step, blob)
    return BlobRef(routes.relay(round, step), weights.sha256(blob), len(blob))


def count_relay_download(open_: OpenRound | None, round: int, step: int, device_id: str) -> None:
    """Count a device's download of a relayed update its open task trains from; NotWanted for anyone else.

    Call it under the lock guarding open_.
    """
    path = routes.relay(round, step)
    task = open_.tasks.get(device_id) if open_ is not None and open_.round == round else None
    if open_ is None or task is None or task.weights.path != path:
        raise NotWanted(f"{device_id} has no open task that trains from {path}")
    open_.bytes_down += task.weights.size
