"""The round loop: plan a round, train it in the strategy's round mode, combine the results, store and
announce the new model.

How a round trains (tasks out, updates in, when it closes) is its mode's, round.modes.MODES, chosen once
from the strategy's `mode`; the updates come in through Uploads, which the HTTP handlers call.
"""

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedspeech.coordinator.config import RoundConfig
from fedspeech.coordinator.privacy.secure_sum_uploads import SecureSumUploads
from fedspeech.coordinator.round import device_tasks, method_needs, new_model
from fedspeech.coordinator.round.acknowledgements import Acknowledgements
from fedspeech.coordinator.round.evaluation_phase import EvaluationPhase, evaluates, evaluation_plan
from fedspeech.coordinator.round.influence import (
    SampleLimits,
    Standings,
    bounded,
    say_where_directions_go_unchecked,
)
from fedspeech.coordinator.round.interfaces import DeviceLink, ModelOps
from fedspeech.coordinator.round.modes import MODES
from fedspeech.coordinator.round.modes.base import RoundContext
from fedspeech.coordinator.round.new_model import RoundTally
from fedspeech.coordinator.round.server_data import CoordinatorClips
from fedspeech.coordinator.round.stragglers import Stragglers
from fedspeech.coordinator.round.uploads import Uploads
from fedspeech.coordinator.state.records import RoundRecord
from fedspeech.coordinator.state.store import StateWriteError, Store
from fedspeech.coordinator.strategies import Result, RoundPlan, make_strategy, summing
from fedspeech.coordinator.strategies.aggregate import server_momentum, without_breakers
from fedspeech.coordinator.strategies.scheduling import depth_for_round, learning_rate_for_round
from fedspeech.models import depth_of
from fedspeech.models.calibration import Decisions
from fedspeech.protocol import weights
from fedspeech.protocol.messages import BlobRef, Profile, Task
from fedspeech.protocol.secure_tally import Tally
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)

UNMEASURED = Profile(cpu_count=1, cpu_freq_mhz=0.0, ram_available_mb=0.0)  # a device that sent no profile
RETRY_S = 5.0  # before a round that failed is run again


class Orchestrator:
    """Runs rounds until the configured number is complete; restarts resume after the last stored round."""

    def __init__(self, config: RoundConfig, store: Store, link: DeviceLink, model: ModelOps) -> None:
        self.config, self.store, self.link, self.model = config, store, link, model
        self.strategy = make_strategy(
            config.strategy, config.k, config.epochs, config.strategy_settings, config.privacy
        )
        if config.secure_aggregation and self.strategy.secure_terms() is None:
            raise ValueError(
                f"the {self.strategy.name} strategy cannot run with secure aggregation: it needs each "
                f"update alone, and the coordinator then sees only their sum ({', '.join(summing())} can)"
            )
        self._local_names = method_needs.local_names(self.strategy, model)  # ValueError if unmet
        self._teacher: BlobRef | None = None  # where devices download a strategy's second model
        self._clips = CoordinatorClips(model, config, self._full, self._learning_rate)
        self._velocity: Arrays | None = None  # server momentum's last step (a restart starts it again)
        self.stragglers = Stragglers()  # who took a task and sent nothing, and sits out rounds for it
        self.standings = Standings()  # how each device's changes have pointed against the others'
        acks = Acknowledgements(config.ack_timeout)  # which devices took their tasks
        self.evaluation = EvaluationPhase(store, link, model.definition.labels, config.eval_min_reports, acks)
        self.settled_round = -1  # the last round whose model is stored and, where asked for, evaluated
        self._device_decisions: Decisions | None = None  # pooled from the latest evaluation on the devices
        self.fleet_counts: dict[str, int] = {}  # clips per label of the last secure round's devices, summed
        # what keeps the next round from starting, in words an operator can act on; None while none waits
        self.waiting: str | None = None
        self.finished = threading.Event()
        # how its rounds train: by the strategy's mode, or summed securely
        self._train = MODES["secure_sum" if config.secure_aggregation else self.strategy.mode]
        self.secure_uploads = SecureSumUploads()  # a secure sum's phases, between HTTP and its mode
        say_where_directions_go_unchecked(config)
        first = model.spec_at(self._depth(1))  # a bad depth schedule fails here, at start-up
        limits = SampleLimits(config.sample_growth, config.samples_over_median, config.max_device_samples)
        self.uploads = Uploads(
            store, link, self.evaluation, spec=first, local_names=self._local_names, limits=limits, acks=acks
        )
        self.evaluation.training = self.uploads.sample_ceiling  # a report's clips within what it trains on

    def run(self, stop: threading.Event) -> None:
        """Run rounds until done or stopped; a round that fails (a full disk, a bug) is run again."""
        latest: RoundRecord | None = None
        while not stop.is_set():
            next_round = latest.round + 1 if latest else 0
            try:
                if latest is None:
                    latest = self._resume()
                elif latest.round >= self.config.rounds:
                    break
                elif (spent := self.strategy.privacy_after(next_round)) and (
                    why := spent.past_budget(next_round)
                ):
                    log.warning("%s", why)
                    self.finished.set()
                    break
                else:
                    latest = self._run_round(next_round, stop) or latest
            except StateWriteError as exc:
                log.error("%s; round %d is run again in %.0f s", exc, next_round, RETRY_S)
                stop.wait(RETRY_S)
            except Exception:
                log.exception("round %d failed; it is run again in %.0f s", next_round, RETRY_S)
                stop.wait(RETRY_S)
        if latest is not None and latest.round >= self.config.rounds:
            log.info("all %d rounds complete", self.config.rounds)
            self.finished.set()

    def _resume(self) -> RoundRecord:
        latest = self.store.latest_round()
        if latest is None:
            arrays = self.first_model()
            latest = self._complete(0, arrays, RoundTally(started=time.time()))
        else:
            data = self.store.model_path(latest.round, "weights").read_bytes()
            arrays = weights.decode(data)[0]
            self.uploads.publish(arrays, self.model.spec_of(arrays))
            teacher = self.store.model_path(latest.round, "teacher")
            if self.strategy.needs.server_data and teacher.exists():  # a server model, as a teacher
                blob = teacher.read_bytes()
                self.strategy.restore(weights.decode(blob)[0])
                self._teacher = new_model.teacher_address(latest.round, blob)
            log.info("resuming after round %d", latest.round)
        self._announce(latest)
        self.settled_round = latest.round
        return latest

    def _run_round(self, round: int, stop: threading.Event) -> RoundRecord | None:
        devices = self._wait_for_devices(round, stop)
        if not devices:
            return None
        if round == 1 and self.model.start is not None:
            self._evaluate_first_model(stop)
        resting = self._still_training(devices) | self.stragglers.sitting_out(round, devices)
        statuses = self.link.statuses()
        profiles = {
            d: statuses[d].profile or UNMEASURED for d in devices if d in statuses and d not in resting
        }
        rng = np.random.default_rng([self.config.seed, round])
        plan = self.strategy.configure_round(round, profiles, rng)
        started = time.time()
        log.info(
            "round %d: %s selected %d of %d devices, aggregating the first %d and waiting for %s",
            round, self.strategy.name, len(plan.work), len(devices), plan.needed, plan.required or "no other",
        )  # fmt: skip
        collected = self._train(round, plan, self._context(round, plan, started, stop))
        if stop.is_set():
            return None
        closed, results, missed = collected.closed, collected.results, collected.missed
        on_time = set(closed.updates)
        if len(results) < min(self.config.min_results, plan.needed):
            log.warning(
                "round %d: %d of %d results by the deadline, fewer than %d: round is run again "
                "(--min-results sets how many it needs, --round-timeout how long it waits)",
                round, len(results), plan.needed, self.config.min_results,
            )  # fmt: skip
            self.strategy.on_round_end(round, plan, on_time, missed, [])
            return None
        results = sorted(results, key=lambda r: r.device_id)
        if collected.combined is not None:  # a secure sum: the model, from no update seen alone
            aggregated: tuple[Arrays, list[Result]] | None = (self._full(collected.combined), results)
        else:  # each update alone: bounded in norm, then as the strategy sees them, then combined
            results = self.strategy.before_aggregate(round, self._bounded(round, results), self._clips)
            aggregated = self._aggregate(round, results)
        if aggregated is None:
            self.strategy.on_round_end(round, plan, on_time, missed, [])
            return None
        new, kept = aggregated
        if collected.tally is not None:
            self._take_tally(collected.tally, [r.device_id for r in results])
        if self.config.server_momentum:
            new, self._velocity = server_momentum(
                self._current, new, self._velocity, self.config.server_momentum
            )
        self.strategy.on_round_end(round, plan, on_time, missed, [r.device_id for r in kept])
        kept_ids = collected.devices_in(kept)
        records = sorted(
            (r for _, r in closed.updates.values() if r.device_id in kept_ids), key=lambda r: r.device_id
        )
        teacher = self.strategy.after_aggregate(round, new, self._clips)
        missing, online = set(closed.tasks) - set(closed.updates), set(self.link.online())
        # gone: offline, or never took its task (an `online` status is a hint: anyone may publish one)
        gone = {d for d in missing if d not in online or d in closed.never_taken}
        stragglers = missing - gone - self.uploads.carried().keys()
        short = closed.optional_results() < closed.needed  # the round waited for them, and closed without
        self.stragglers.after(round, stragglers if short else (), closed.updates)
        tally = RoundTally(
            started, devices=len(plan.work), updates=records, bytes_up=closed.bytes_up,
            bytes_down=closed.bytes_down, withdrawn=len(gone),
            stragglers=len(stragglers),
            privacy=self.strategy.privacy_after(round),
        )  # fmt: skip
        record = self._complete(round, new, tally, teacher)
        self.store.remove_relays(round)
        # under secure aggregation the devices' evaluations come only summed, in the next round's tally
        if (
            evaluates(round, self.config.eval_every, self.config.rounds)
            and not self.config.secure_aggregation
        ):
            try:
                record = self._evaluate_on_devices(record, stop)
            except StateWriteError as exc:  # the round itself is stored: it stands
                log.error("%s; the round stands without it", exc)
        self._announce(record)
        self.settled_round = round
        return record

    def _context(self, round: int, plan: RoundPlan, started: float, stop: threading.Event) -> RoundContext:
        """What the round's mode works with; its tasks carry the plan's work for each device."""

        def tasks(devices: Sequence[str], deadline: float) -> dict[str, Task]:
            work = {d: device_tasks.training(self.config, round, plan, d) for d in devices}
            return self._tasks(round, deadline, work)

        return RoundContext(
            started, self.config, self.uploads, self.link, self.store, tasks, stop, self.secure_uploads,
            self.strategy.secure_terms(),
        )  # fmt: skip

    def _still_training(self, ready: Sequence[str]) -> set[str]:
        """The devices busy with an earlier round's task, once the tasks no longer wanted are dropped."""
        dropped, busy = self.uploads.drop_late(ready, self.model.spec_of(self._current))
        for device in dropped:
            log.info("%s's task of an earlier round is no longer wanted", device)
            self.link.clear_task(device)
        return busy

    def _bounded(self, round: int, results: list[Result]) -> list[Result]:
        """The results as influence.bounded leaves them, whatever the strategy."""
        return bounded(round, self.uploads.shared(self._current), results, self.config, self.standings)

    def _aggregate(self, round: int, results: Sequence[Result]) -> tuple[Arrays, list[Result]] | None:
        """The strategy's new global weights and the results in them; None if no result can be aggregated.

        Results that break the aggregation on their own (it raises, or gives weights that are not finite)
        are dropped, and the others aggregated without them.
        """
        shared = self.uploads.shared(self._current)
        aggregated = without_breakers(
            lambda some: self._full(self.strategy.aggregate(round, some, shared)), results, self._current
        )
        if aggregated is None:
            log.error("round %d: the updates cannot be aggregated; the round is run again", round)
            return None
        dropped = sorted({r.device_id for r in results} - {r.device_id for r in aggregated[1]})
        if dropped:
            log.warning("round %d: dropped the updates of %s: each breaks the aggregation", round, dropped)
        return aggregated

    def _full(self, shared: Arrays) -> Arrays:
        """Shared arrays completed with the global model's own normalisation layers."""
        return {**{name: self._current[name] for name in self._local_names}, **shared}

    def _evaluate_on_devices(self, record: RoundRecord, stop: threading.Event) -> RoundRecord:
        """Ask online devices to evaluate the round's model on their test splits; store what they report.

        The round's ONNX model is exported again with its threshold calibrated on the word decisions the
        devices counted (the record returned has its new digest): the model announced next is calibrated
        on its own decisions, not an earlier model's.
        """
        registered = self.store.registered()
        online = [d for d in self.link.online() if d in registered]
        training = self.uploads.carried()
        devices, deadline = evaluation_plan(self.config, record.round, online, training, time.time())
        evaluate = device_tasks.evaluation(record.round, self.strategy.personal)
        tasks = self._tasks(record.round, deadline, dict.fromkeys(devices, evaluate))
        decisions = self.evaluation.run(record.round, tasks, deadline, stop)
        if decisions is None:
            return record
        self._device_decisions = decisions
        onnx = self.model.to_onnx(self._current, record.round, decisions)
        return self.store.replace_onnx(record, onnx.model, onnx.pair)

    def _evaluate_first_model(self, stop: threading.Event) -> None:
        """A trained first model (--init), evaluated on the devices once they are online, before round 1
        trains from it; under secure aggregation round 1's tallies evaluate it instead.
        """
        first = self.store.latest_round()
        if first is None or first.round != 0 or self.config.secure_aggregation or not self.config.eval_every:
            return
        try:
            record = self._evaluate_on_devices(first, stop)
        except StateWriteError as exc:
            log.error("%s; round 1 trains without it", exc)
            return
        self._announce(record)

    def _take_tally(self, tally: Tally, devices: Sequence[str]) -> None:
        """A secure round's sums: the clips per label its devices train on, and their evaluation of the
        model they were sent, stored as that model's round's federated evaluation (whose word decisions
        calibrate the models exported next).
        """
        labels = self.model.definition.labels
        self.fleet_counts = dict(zip(labels, tally.train_counts.tolist(), strict=True))
        decisions = self.evaluation.take_summed(self.settled_round, tally, devices)
        self._device_decisions = decisions or self._device_decisions

    def _tasks(self, round: int, deadline: float, work: Mapping[str, Mapping[str, Any]]) -> dict[str, Task]:
        """One task per device on the latest global model, with that device's work."""
        return device_tasks.make_tasks(
            round, deadline, work,
            model=device_tasks.latest_weights(self.store, self.config.precision, self._current),
            spec=self.model.spec_of(self._current), definition=self.model.definition, config=self.config,
            learning_rate=self._learning_rate(round), teacher=self._teacher,
        )  # fmt: skip

    @property
    def _current(self) -> Arrays:
        """The global weights devices train now."""
        return self.uploads.current

    def _wait_for_devices(self, round: int, stop: threading.Event) -> list[str]:
        """The registered devices online, once there are enough for the round; [] if stopped first.

        Meanwhile `waiting` says what the round waits for, logged once each time that changes.
        """
        try:
            while not stop.is_set():
                registered = self.store.registered()
                ready = [d for d in self.link.online() if d in registered]
                needed = max(self.config.min_devices, self.strategy.needs.min_devices)
                if len(ready) >= needed:
                    return ready
                waiting = self._too_few(round, needed, len(ready))
                if waiting != self.waiting:
                    log.info("%s", waiting)
                    self.waiting = waiting
                stop.wait(0.25)
            return []
        finally:
            self.waiting = None

    def _too_few(self, round: int, needed: int, ready: int) -> str:
        """Why the round cannot start with ready devices, and what would start it."""
        more = needed - ready
        text = f"round {round} needs {needed} devices, {ready or 'none'} online: start "
        text += "another" if more == 1 else f"{more} more"
        own = self.strategy.needs.min_devices  # the strategy's own minimum
        if ready >= max(own, 1):
            return f"{text} or set --min-devices {ready}"
        if own > self.config.min_devices:
            return f"{text} (the {self.strategy.name} strategy needs {own})"
        return text

    def _complete(
        self, round: int, arrays: Arrays, tally: RoundTally, teacher: Arrays | None = None
    ) -> RoundRecord:
        """Grow if the next round is deeper, then store a new global model and publish it to the round loop;
        its ONNX model calibrated with the devices' latest word decisions, if any.
        """
        arrays = self._grown_for(round + 1, arrays)
        record, teacher_at = new_model.store_round(
            self.store, self.model, round, arrays, tally, teacher, self._device_decisions
        )
        self.uploads.publish(arrays, self.model.spec_of(arrays))
        self._teacher = teacher_at or self._teacher
        return record

    def _announce(self, record: RoundRecord) -> None:
        """Announce the stored global model to devices and listeners."""
        self.link.announce(new_model.announcement(self.store, self.model, record, self._current))

    def _learning_rate(self, round: int) -> float:
        """The devices' learning rate in a round, on the configured schedule (round 0's: round 1's; its
        tasks only evaluate).
        """
        c = self.config
        return learning_rate_for_round(max(round, 1), c.rounds, c.lr, c.final_lr_fraction)

    def first_model(self) -> Arrays:
        """Round 0's weights: the model's start (--init), or fresh ones at round 1's depth."""
        return self.model.initial(self.config.seed, self._depth(1))

    def _depth(self, round: int) -> int | None:
        """The depth the schedule gives a round, None for a model that does not grow."""
        full = self.model.spec.depth
        if full is None:
            return None
        stages = self.config.depth_stages or full
        return depth_for_round(round, self.config.rounds, full, self.config.depth_schedule, stages)

    def _grown_for(self, round: int, arrays: Arrays) -> Arrays:
        """The arrays with the blocks the round adds (zero-initialised outputs), or as they are."""
        depth = self._depth(round) if round <= self.config.rounds else None
        if depth is None or depth <= depth_of(arrays):
            return arrays
        log.info("round %d: growing the model from %d to %d blocks", round, depth_of(arrays), depth)
        seed = self.config.seed * 100_003 + round
        return self.model.grow(arrays, depth, seed, self.config.new_blocks)
