"""The secure-sum round mode, after Bonawitz et al. 2017, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning": the coordinator learns the sum of the round's updates and never one
device's.

Every selected device that registered an identity key gets its task with its part in the sum: it signs and
advertises fresh keys, hands the others sealed shares of its secrets, trains, uploads its change clipped,
weighted by its clips and masked, and gives up the shares that unmask the sum of those that uploaded. Each
phase closes when every device it expects has answered, or at its time; a device that drops out after the
keys are agreed is masked out of the sum from its shares. Too few devices left at any phase, and the round
fails: it is run again, never aggregated from a wrong sum. Every result handed back is the round's mean
update, one per device in it: the strategy's weighted mean of them is that mean again.
"""

import logging
import math
import time
from dataclasses import replace

import numpy as np

from fedspeech.coordinator.open_round import OpenRound
from fedspeech.coordinator.records import UpdateRecord
from fedspeech.coordinator.rounds.base import Collected, RoundContext
from fedspeech.coordinator.secure_sum_server import ServerRound
from fedspeech.coordinator.strategies import Result, RoundPlan
from fedspeech.protocol import secure_sum as ss
from fedspeech.protocol import signing
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import SecureSum

log = logging.getLogger(__name__)


def threshold(devices: int, fraction: float) -> int:
    """How many of a round's devices rebuild a secret: the fraction of them, rounded up, at least 2."""
    return max(2, math.ceil(fraction * devices - 1e-9))


def weights(samples: dict[str, int]) -> dict[str, float]:
    """Each device's weight in the sum: its training clips against the most any device of the round has."""
    most = max(max(samples.values()), 1)
    return {d: max(n, 1) / most for d, n in samples.items()}


def train(round: int, plan: RoundPlan, context: RoundContext) -> Collected:
    """The selected devices with identity keys train; the coordinator unmasks the sum of their changes."""
    config, inbox, desk = context.config, context.inbox, context.desk
    identities = context.store.identity_keys(plan.work)
    left_out = [d for d in plan.work if d not in identities]
    if left_out:
        log.warning("round %d: %s registered no identity key and cannot join a secure sum", round, left_out)
    devices = [d for d in plan.work if d in identities]
    needed = threshold(len(devices), config.secure_threshold)
    deadline = context.started + config.round_timeout_s
    current = inbox.shared(inbox.current)
    length = sum(current[name].size for name in ss.layout(current))
    samples = {d: (record.num_samples if (record := context.store.device(d)) else 1) for d in devices}
    share = weights(samples)
    clip, unmask_s = config.secure_clip, config.secure_keys_timeout_s
    tasks = {
        d: replace(task, secure_sum=SecureSum(needed, len(devices), clip, share[d], unmask_s))
        for d, task in context.tasks(devices, deadline).items()
    }
    inbox.open(OpenRound(round, context.started, deadline, tasks, plan.needed, frozenset()))
    keys = {d: signing.parse_public_key(identities[d]) for d in devices}
    survivors: list[str] = []
    try:
        if len(devices) < needed:
            raise ProtocolError(f"{len(devices)} devices with identity keys, fewer than {needed}")
        desk.open(ServerRound(round, needed, length, keys), {d: identities[d] for d in devices})
        for device, task in tasks.items():
            context.link.publish_task(task, device)
        survivors, total, missed = _phases(round, plan, context, len(devices))
    except ProtocolError as exc:
        log.warning("round %d: the secure sum failed: %s", round, exc)
        missed = True
    finally:
        bytes_up, bytes_down = desk.bytes_up, desk.bytes_down
        desk.end()
        closed, over = inbox.close()
        for device in over:
            context.link.clear_task(device)
    closed.bytes_up += bytes_up
    closed.bytes_down += bytes_down
    if context.stop.is_set() or not survivors:
        return Collected(closed, [], missed)
    fixed, weight = ss.FixedPoint(config.secure_clip, len(devices)), sum(share[d] for d in survivors)
    new = ss.with_change(current, fixed.decode(total) / weight)
    for device in survivors:
        result = Result(device, new, samples[device])
        closed.updates[device] = (result, UpdateRecord(device, samples[device], None, None, ""))
    log.info(
        "round %d: the secure sum of %d devices' changes, each clipped to %g; its mean off by at most %.3g "
        "a weight in fixed point", round, len(survivors), config.secure_clip, fixed.max_error / weight,
    )  # fmt: skip
    return Collected(closed, [closed.updates[d][0] for d in survivors], missed, combined=True)


def _phases(
    round: int, plan: RoundPlan, context: RoundContext, devices: int
) -> tuple[list[str], np.ndarray, bool]:
    """Run the four phases: the survivors, the sum of their encoded changes, and whether the upload phase
    ran into the deadline. ProtocolError when too few devices remain at a phase.
    """
    config, desk, stop = context.config, context.desk, context.stop
    deadline = context.started + config.round_timeout_s
    keys_until = min(deadline, time.time() + config.secure_keys_timeout_s)
    desk.wait(devices, keys_until, stop)
    desk.wait(len(desk.close()), keys_until, stop)  # the adverts, then the shares
    sharers = desk.close()
    came = desk.wait(min(plan.needed, len(sharers)), deadline, stop)
    missed = len(came) < len(sharers) and time.time() >= deadline
    survivors = desk.close()
    if stop.is_set():
        return [], np.zeros(0), missed
    desk.wait(len(survivors), deadline + config.secure_keys_timeout_s, stop)
    desk.close()
    total, liars = desk.total()
    if liars:
        log.warning(
            "round %d: %s gave up wrong shares; the sum was rebuilt without them", round, sorted(liars)
        )
    return survivors, total, missed
