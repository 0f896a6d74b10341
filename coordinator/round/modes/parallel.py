"""The parallel round mode: every selected device trains from the global model at once; the round closes
on the results it needs, with its required devices, or at its deadline.
"""

import logging
import math
import time
from dataclasses import replace

from fedspeech.coordinator.round.modes.base import Collected, RoundContext
from fedspeech.coordinator.round.open_round import OpenRound
from fedspeech.coordinator.strategies import Result, RoundPlan, aggregate
from fedspeech.protocol import weights

log = logging.getLogger(__name__)


def train(round: int, plan: RoundPlan, context: RoundContext) -> Collected:
    """Every selected device trains from the global model; until the results are in or the deadline."""
    return hand_out_and_collect(round, plan, context, buffered=False)


def hand_out_and_collect(round: int, plan: RoundPlan, context: RoundContext, buffered: bool) -> Collected:
    """Hand every selected device its task, wait for the round to complete, close it and take its results.

    buffered: the round takes results past its count, and its tasks not answered go on (FedBuff's).
    """
    uploads, link = context.uploads, context.link
    deadline = context.started + context.config.round_timeout
    tasks = context.tasks(list(plan.work), deadline)
    required = frozenset(plan.required)
    # a round closes once half its devices (and min_results) have uploaded and the others' grace has passed:
    # one device that takes its task and never answers costs seconds, not the round timeout
    enough = max(context.config.min_results, math.ceil(len(tasks) / 2))
    grace = 0.0 if buffered else context.config.straggler_grace
    opened = OpenRound(
        round, context.started, deadline, tasks, plan.needed, required, buffered, enough=enough, grace=grace
    )
    uploads.open(opened)
    for device, task in tasks.items():
        link.publish_task(task, device)
    uploads.wait_until_complete(context.stop)
    closed, over = uploads.close()
    for device in over:
        link.clear_task(device)
    if context.stop.is_set():  # nothing is aggregated
        return Collected(closed, [], missed=False)
    missed = time.time() >= closed.deadline and not uploads.complete(closed)
    waited_for = sorted(set(tasks) - set(closed.updates))
    if waited_for and closed.grace_over(time.time()) and not missed:
        log.info(
            "round %d: closed without %s, %.1f s after %d of its %d devices had uploaded",
            round, ", ".join(waited_for), time.time() - (closed.enough_at or 0.0), closed.enough, len(tasks),
        )  # fmt: skip
    laid_on = (rebased(round, result, context) for result, _ in closed.updates.values())
    return Collected(closed, [r for r in laid_on if r is not None], missed)


def rebased(round: int, result: Result, context: RoundContext) -> Result | None:
    """A result's change from the model its device received, laid onto the current model; None if it
    cannot be. A float32 result of this round is that already.
    """
    precision = context.config.precision
    if not result.staleness and precision == "float32":
        return result
    uploads, current = context.uploads, context.uploads.current
    if result.staleness:
        data = context.store.model_path(round - 1 - result.staleness, "weights").read_bytes()
        trained_from = weights.decode(data)[0]
    else:
        trained_from = current
    # as the device received it: the download's rounding is not part of its change
    base = weights.with_precision(uploads.shared(trained_from), precision)
    base = weights.with_precision(base, "float32")
    try:
        arrays = aggregate.rebased(result.arrays, base, uploads.shared(current))
    except ValueError as exc:
        log.warning("round %d: dropped the late update of %s: %s", round, result.device_id, exc)
        return None
    return replace(result, arrays=arrays)
