"""The secure-sum round mode, after Bonawitz et al. 2017, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning": the coordinator learns the sum of the round's updates and never one
device's.

Every selected device that registered an identity key gets its task with its part in the sum: it signs and
advertises fresh keys, hands the others sealed shares of its secrets, trains, uploads its change bounded
in norm, weighted by its clips and masked, and gives up the shares that unmask the sum of those that
uploaded. Each phase closes when every device it expects has answered, or at its time; a device that drops
out after the keys are agreed is masked out of the sum from its shares. Too few devices left at any phase,
and the round fails: it is run again, never aggregated from a wrong sum. The strategy's terms say how the
sum becomes the new model: the changes' norm bound, their weights (by clips, or alike), the Gaussian noise
the devices add in parts (distributed differential privacy), what the sum is divided by, and whether each
device says with noise if its change was within the bound (adaptive clipping). After each change comes the
device's tally (protocol.secure_tally): its clips per label and its evaluation of the model it was sent,
which the coordinator also learns only summed.
"""

import logging
import math
import time
from dataclasses import replace

import numpy as np

from fedspeech.coordinator.privacy.secure_sum_server import ServerRound
from fedspeech.coordinator.round.modes.base import Collected, RoundContext
from fedspeech.coordinator.round.open_round import OpenRound, grace_end
from fedspeech.coordinator.state.records import UpdateRecord
from fedspeech.coordinator.strategies import Result, RoundPlan, SecureTerms
from fedspeech.protocol import secure_sum_maths as ss
from fedspeech.protocol import signing
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.messages import SecureSum
from fedspeech.protocol.secure_tally import decode_tally, tally_length

log = logging.getLogger(__name__)


def threshold(devices: int, fraction: float) -> int:
    """How many of a round's devices rebuild a secret: the fraction of them, rounded up, at least 2."""
    return max(2, math.ceil(fraction * devices - 1e-9))


def device_noise(noise_multiplier: float, clip: float, threshold: int, devices: int, length: int) -> float:
    """Each device's part of the sum's Gaussian noise: its deviation, so that the noise of `threshold`
    devices or more is noise_multiplier times what one device can move the sum by (its clip, and the
    fixed point's rounding of its `length` values) at the least.
    """
    if not noise_multiplier:
        return 0.0
    coarsest = ss.fixed_point(clip, noise_multiplier * clip, devices)  # no round's steps are longer
    reach = clip + 0.5 * math.sqrt(length) / coarsest.scale
    # The sum of rounded Gaussians at deviations of millions of steps is the Gaussian mechanism for the
    # accountant; the distributed discrete Gaussian (Kairouz et al. 2021) makes this exact at few steps.
    return noise_multiplier * reach / math.sqrt(threshold)


def weights(samples: dict[str, int]) -> dict[str, float]:
    """Each device's weight in the sum: its training clips against the most any device of the round has."""
    most = max(max(samples.values()), 1)
    return {d: max(n, 1) / most for d, n in samples.items()}


def sum_bound(bounds: list[float], noise: float, length: int, rounding: float) -> float:
    """The longest a secure sum of changes can be when each is within its bound: their bounds added, the
    fixed point's rounding of every weight, and, with noise of deviation `noise` on each device, a norm
    of the summed Gaussian that fewer than one round in ten million goes past (the chi distribution's tail).
    """
    noise_norm = noise * math.sqrt(len(bounds)) * (math.sqrt(length) + 6.0)
    return sum(bounds) + rounding * math.sqrt(length) + noise_norm


def train(round: int, plan: RoundPlan, context: RoundContext) -> Collected:
    """The selected devices with identity keys train; the coordinator unmasks the sum of their changes."""
    config, uploads, secure_uploads = context.config, context.uploads, context.secure_uploads
    identities = context.store.identity_keys(plan.work)
    left_out = [d for d in plan.work if d not in identities]
    if left_out:
        log.warning("round %d: %s registered no identity key and cannot join a secure sum", round, left_out)
    devices = [d for d in plan.work if d in identities]
    if aside := secure_uploads.suspects.aside(round, devices):
        log.warning(
            "round %d: %s kept out of the secure sum: named for a change it did not bound, or tried as "
            "the next suspect of one", round, ", ".join(sorted(aside)),
        )  # fmt: skip
        devices = [d for d in devices if d not in aside]
    needed = threshold(len(devices), config.secure_threshold)
    deadline = context.started + config.round_timeout
    current = uploads.shared(uploads.current)
    length = sum(current[name].size for name in ss.layout(current))  # the change's, then the tally's
    classes = uploads.current_spec().num_classes
    # what each counts for: its registration, grown slowly and within a multiple of the fleet's median
    samples = {d: max(1, uploads.sample_ceiling(d)) for d in devices}
    terms = context.secure_terms or SecureTerms()
    share = weights(samples) if terms.weighted else dict.fromkeys(devices, 1.0)
    clip, unmask_s = terms.clip or config.secure_norm_bound, config.secure_keys_timeout
    counted = length + (1 if terms.count_scale else 0)  # the change, and its count where it has one
    bound = ss.vector_bound(clip, terms.count_scale)
    noise = device_noise(terms.noise_multiplier, bound, needed, len(devices), counted)
    settings = {
        d: SecureSum(needed, len(devices), clip, share[d], unmask_s, noise, terms.count_scale)
        for d in devices
    }
    tasks = {d: replace(task, secure_sum=settings[d]) for d, task in context.tasks(devices, deadline).items()}
    uploads.open(OpenRound(round, context.started, deadline, tasks, plan.needed, frozenset()))
    keys = {d: signing.parse_public_key(identities[d]) for d in devices}
    survivors: list[str] = []
    try:
        if len(devices) < needed:
            raise ProtocolError(f"{len(devices)} devices with identity keys, fewer than {needed}")
        secure_uploads.open(
            ServerRound(round, needed, counted + tally_length(classes), keys),
            {d: identities[d] for d in devices},
        )
        for device, task in tasks.items():
            context.link.publish_task(task, device)
        survivors, total, missed = _phases(round, plan, context, len(devices), needed)
    except ProtocolError as exc:
        log.warning("round %d: the secure sum failed: %s", round, exc)
        missed = True
    finally:
        bytes_up, bytes_down = secure_uploads.bytes_up, secure_uploads.bytes_down
        secure_uploads.end()
        closed, over = uploads.close()
        for device in over:
            context.link.clear_task(device)
    closed.bytes_up += bytes_up
    closed.bytes_down += bytes_down
    if context.stop.is_set() or not survivors:
        return Collected(closed, [], missed)
    fixed = ss.fixed_point(bound, noise, len(devices))
    denominator = terms.denominator or sum(share[d] for d in survivors)
    values = fixed.decode(total[:counted])
    most = sum_bound([share[d] * clip for d in survivors], noise, length, fixed.max_error)
    if (norm := float(np.linalg.norm(values[:length]))) > most:
        log.error(
            "round %d: the secure sum's norm is %.4g, more than %.4g, the most %d changes bounded to %g can "
            "give: a device did not bound its own; the round is run again, with one of them left out in turn",
            round, norm, most, len(survivors), clip,
        )  # fmt: skip
        secure_uploads.suspects.refused(survivors)
        return Collected(closed, [], missed)
    secure_uploads.suspects.passed(round)
    new = ss.with_change(current, values[:length] / denominator)
    for device in survivors:
        closed.updates[device] = (
            Result(device, new, samples[device]),
            UpdateRecord(device, samples[device], None, None, ""),
        )
    noised = f", with noise of deviation {noise:.4g} added on each device" if noise else ""
    log.info(
        "round %d: the secure sum of %d devices' changes, each bounded to norm %g on its device%s; its mean "
        "off by at most %.3g a weight in fixed point",
        round, len(survivors), clip, noised, fixed.max_error / denominator,
    )  # fmt: skip
    results = [closed.updates[d][0] for d in survivors]
    tally = decode_tally(total[counted:], classes)
    if terms.count_scale and terms.on_count is not None:  # adaptive clipping's noised count
        terms.on_count(round, float(values[length] / terms.count_scale))
    return Collected(closed, results, missed, combined=new, tally=tally)


def _phases(
    round: int, plan: RoundPlan, context: RoundContext, devices: int, threshold: int
) -> tuple[list[str], np.ndarray, bool]:
    """Run the four phases: the survivors, the sum of their encoded changes, and whether the upload phase
    ran into the deadline. ProtocolError when too few devices remain at a phase.
    """
    config, secure_uploads, stop = context.config, context.secure_uploads, context.stop
    deadline = context.started + config.round_timeout
    keys_until = min(deadline, time.time() + config.secure_keys_timeout)
    _gather(context, devices, devices, threshold, keys_until)  # the adverts
    advertised = len(secure_uploads.close())
    _gather(context, advertised, advertised, threshold, keys_until)  # then the shares
    sharers = secure_uploads.close()
    came = _gather(context, len(sharers), min(plan.needed, len(sharers)), threshold, deadline)
    missed = len(came) < len(sharers) and time.time() >= deadline
    survivors = secure_uploads.close()
    if stop.is_set():
        return [], np.zeros(0), missed
    _gather(context, len(survivors), len(survivors), threshold, deadline + config.secure_keys_timeout)
    secure_uploads.close()
    total, liars, left_out = secure_uploads.total()
    if liars:
        log.warning(
            "round %d: %s gave up wrong shares; the sum was rebuilt without them", round, sorted(liars)
        )
    for device, unopened in left_out.items():
        log.warning(
            "round %d: %s handed out shares that did not open (for %s): its update was left out of the sum",
            round, device, ", ".join(unopened) or "every device",
        )  # fmt: skip
    return [d for d in survivors if d not in left_out], total, missed


def _gather(context: RoundContext, group: int, needed: int, least: int, until: float) -> set[str]:
    """Wait for a phase's messages: from all `group` devices, or from `needed` of them once half the
    group (and `least`) have sent theirs and the others' grace has passed (straggler_grace), or until
    `until`. A device that agrees keys and goes silent costs the round seconds, not its timeout.
    """
    uploads, stop, grace = context.secure_uploads, context.stop, context.config.straggler_grace
    since = time.time()
    enough = min(needed, max(least, math.ceil(group / 2)))
    came = uploads.wait(enough if grace else needed, until, stop)
    if grace and enough <= len(came) < needed:
        came = uploads.wait(needed, min(until, grace_end(since, time.time(), grace)), stop)
    return came
