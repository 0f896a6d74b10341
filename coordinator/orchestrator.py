"""The round loop: select devices, hand out tasks, collect and check updates, aggregate, store, announce."""

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from fedspeech.coordinator import device_tasks, method_needs, round_storage
from fedspeech.coordinator.aggregate import rebased, server_momentum, without_breakers
from fedspeech.coordinator.evaluation_phase import EvaluationPhase, evaluates, evaluation_plan
from fedspeech.coordinator.inbox import Inbox
from fedspeech.coordinator.open_round import OpenRound
from fedspeech.coordinator.ports import DeviceLink, ModelOps
from fedspeech.coordinator.round_config import RoundConfig
from fedspeech.coordinator.round_storage import RoundTally
from fedspeech.coordinator.rounds import chained
from fedspeech.coordinator.rounds.chains import Chain
from fedspeech.coordinator.scheduling import depth_for_round, learning_rate_for_round
from fedspeech.coordinator.server_side import CoordinatorClips
from fedspeech.coordinator.store import RoundRecord, StateWriteError, Store
from fedspeech.coordinator.strategies import Result, RoundPlan, make_strategy
from fedspeech.models import depth_of
from fedspeech.protocol import weights
from fedspeech.protocol.messages import BlobRef, Profile, Task
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)

UNMEASURED = Profile(cpu_count=1, cpu_freq_mhz=0.0, ram_available_mb=0.0)  # a device that sent no profile
RETRY_S = 5.0  # before a round that failed is run again


class Orchestrator:
    """Runs rounds until the configured number is complete; restarts resume after the last stored round."""

    def __init__(self, config: RoundConfig, store: Store, link: DeviceLink, model: ModelOps) -> None:
        self.config, self.store, self.link, self.model = config, store, link, model
        self.strategy = make_strategy(config.strategy, config.k, config.epochs, config.strategy_options)
        self._local_names = method_needs.local_names(self.strategy, model)  # ValueError if unmet
        self._teacher: BlobRef | None = None  # where devices download a strategy's second model
        self._clips = CoordinatorClips(model, config, self._full, self._learning_rate)
        self._velocity: Arrays | None = None  # server momentum's last step (a restart starts it again)
        self.evaluation = EvaluationPhase(store, link, model.spec.num_classes, config.eval_min_reports)
        self.settled_round = -1  # the last round whose model is stored and, where asked for, evaluated
        self.finished = threading.Event()
        first = model.spec_at(self._depth(1))  # a bad depth schedule fails here, at start-up
        self.inbox = Inbox(
            store, link, self.evaluation, spec=first, local_names=self._local_names,
            max_samples=config.max_device_samples,
        )  # fmt: skip

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
            arrays = self.model.initial(self.config.seed, self._depth(1))
            latest = self._complete(0, arrays, RoundTally(started=time.time()))
            self.settled_round = 0
        else:
            data = self.store.model_path(latest.round, "weights").read_bytes()
            arrays = weights.decode(data)[0]
            self.inbox.publish(arrays, self.model.spec_of(arrays))
            teacher = self.store.model_path(latest.round, "teacher")
            if self.strategy.needs.server_data and teacher.exists():  # a server model, as a teacher
                blob = teacher.read_bytes()
                self.strategy.restore(weights.decode(blob)[0])
                self._teacher = round_storage.teacher_address(latest.round, blob)
            log.info("resuming after round %d", latest.round)
            self.link.announce(round_storage.announcement(self.store, self.model, latest, arrays))
            self.settled_round = latest.round
        return latest

    def _run_round(self, round: int, stop: threading.Event) -> RoundRecord | None:
        devices = self._wait_for_devices(stop)
        if not devices:
            return None
        busy = self._still_training(devices)
        statuses = self.link.statuses()
        profiles = {d: statuses[d].profile or UNMEASURED for d in devices if d in statuses and d not in busy}
        rng = np.random.default_rng([self.config.seed, round])
        plan = self.strategy.configure_round(round, profiles, rng)
        started = time.time()
        log.info(
            "round %d: %s selected %d of %d devices, aggregating the first %d and waiting for %s",
            round, self.strategy.name, len(plan.work), len(devices), plan.needed, plan.required or "no other",
        )  # fmt: skip
        train = self._train_in_groups if plan.groups else self._train_in_parallel
        open_ = train(round, plan, started, stop)
        if stop.is_set():
            return None
        on_time = set(open_.updates)
        missed = any(c.skipped for c in open_.chains) or (
            not open_.chains and time.time() >= open_.deadline and not self.inbox.complete(open_)
        )
        if open_.chains:
            results = [r for c in open_.chains if (r := c.result()) is not None]
        else:
            laid_on = (self._rebased(round, result) for result, _ in open_.updates.values())
            results = [r for r in laid_on if r is not None]
        if len(results) < min(self.config.min_results, plan.needed):
            log.warning(
                "round %d: %d of %d results by the deadline, fewer than %d: round is run again",
                round, len(results), plan.needed, self.config.min_results,
            )  # fmt: skip
            self.strategy.on_round_end(round, plan, on_time, missed, [])
            return None
        results = self.strategy.before_aggregate(
            round, sorted(results, key=lambda r: r.device_id), self._clips
        )
        aggregated = self._aggregate(round, results)
        if aggregated is None:
            self.strategy.on_round_end(round, plan, on_time, missed, [])
            return None
        new, kept = aggregated
        if self.config.server_momentum:
            new, self._velocity = server_momentum(
                self._current, new, self._velocity, self.config.server_momentum
            )
        self.strategy.on_round_end(round, plan, on_time, missed, [r.device_id for r in kept])
        kept_ids = {r.device_id for r in kept}
        if open_.chains:  # a group's result stands for every update of the group
            kept_ids = {d for c in open_.chains if c.last and c.last.device_id in kept_ids for d in c.devices}
        records = sorted(
            (r for _, r in open_.updates.values() if r.device_id in kept_ids), key=lambda r: r.device_id
        )
        teacher = self.strategy.after_aggregate(round, new, self._clips)
        missing, online = set(open_.tasks) - set(open_.updates), set(self.link.online())
        tally = RoundTally(
            started, devices=len(plan.work), updates=records, bytes_up=open_.bytes_up,
            bytes_down=open_.bytes_down, withdrawn=len(missing - online),
            stragglers=len(missing & online - self.inbox.carried().keys()),
        )  # fmt: skip
        record = self._complete(round, new, tally, teacher)
        self.store.remove_relays(round)
        if evaluates(round, self.config.eval_every, self.config.rounds):
            try:
                self._evaluate_on_devices(record, stop)
            except StateWriteError as exc:  # the round itself is stored: it stands
                log.error("%s; the round stands without it", exc)
        self.settled_round = round
        return record

    def _train_in_parallel(
        self, round: int, plan: RoundPlan, started: float, stop: threading.Event
    ) -> OpenRound:
        """Every selected device trains from the global model; until the results are in or the deadline."""
        deadline = started + self.config.round_timeout_s
        work = {d: device_tasks.training(self.config, round, plan, d) for d in plan.work}
        tasks = self._tasks(round, deadline, work)
        # a buffered round: who has not answered trains on; its update counts later
        buffered = self.strategy.mode == "buffered"
        required = frozenset(plan.required)
        self.inbox.open(OpenRound(round, started, deadline, tasks, plan.needed, required, buffered))
        for device, task in tasks.items():
            self.link.publish_task(task, device)
        self.inbox.wait_until_complete(stop)
        open_, over = self.inbox.close()
        for device in over:
            self.link.clear_task(device)
        return open_

    def _still_training(self, ready: Sequence[str]) -> set[str]:
        """The devices busy with an earlier round's task, once the tasks no longer wanted are dropped."""
        dropped, busy = self.inbox.drop_late(ready, self.model.spec_of(self._current))
        for device in dropped:
            log.info("%s's task of an earlier round is no longer wanted", device)
            self.link.clear_task(device)
        return busy

    def _rebased(self, round: int, result: Result) -> Result | None:
        """A result's change from the model its device received, laid onto the current model; None if it
        cannot be. A float32 result of this round is that already.
        """
        if not result.staleness and self.config.precision == "float32":
            return result
        if result.staleness:
            data = self.store.model_path(round - 1 - result.staleness, "weights").read_bytes()
            trained_from = weights.decode(data)[0]
        else:
            trained_from = self._current
        # as the device received it: the download's rounding is not part of its change
        base = weights.with_precision(self.inbox.shared(trained_from), self.config.precision)
        base = weights.with_precision(base, "float32")
        try:
            arrays = rebased(result.arrays, base, self.inbox.shared(self._current))
        except ValueError as exc:
            log.warning("round %d: dropped the late update of %s: %s", round, result.device_id, exc)
            return None
        return replace(result, arrays=arrays)

    def _train_in_groups(
        self, round: int, plan: RoundPlan, started: float, stop: threading.Event
    ) -> OpenRound:
        """Each group's devices train one after another, each from the last good update before it.

        Groups run side by side; the round ends when every group is through (see rounds.chained).
        """
        chains = [Chain(list(group)) for group in plan.groups]
        # every device's update is taken: each is where the next one in its group starts
        open_ = OpenRound(round, started, started, {}, len(plan.work), frozenset(), chains=chains)

        def make_task(device: str) -> Task:
            deadline = time.time() + self.config.round_timeout_s
            work = device_tasks.training(self.config, round, plan, device)
            return self._tasks(round, deadline, {device: work})[device]

        self.inbox.open(open_)
        chained.train_in_groups(round, chains, self.inbox, self.link, self.store, make_task, stop)
        self.inbox.close()
        for chain in chains:
            if chain.current is not None:
                self.link.clear_task(chain.current)
        return open_

    def _aggregate(self, round: int, results: Sequence[Result]) -> tuple[Arrays, list[Result]] | None:
        """The strategy's new global weights and the results in them; None if no result can be aggregated.

        Results that break the aggregation on their own (it raises, or gives weights that are not finite)
        are dropped, and the others aggregated without them.
        """
        shared = self.inbox.shared(self._current)
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

    def _evaluate_on_devices(self, record: RoundRecord, stop: threading.Event) -> None:
        """Ask online devices to evaluate the round's model on their test splits; store what they report."""
        registered = self.store.registered()
        online = [d for d in self.link.online() if d in registered]
        training = self.inbox.carried()
        devices, deadline = evaluation_plan(self.config, record.round, online, training, time.time())
        evaluate = device_tasks.evaluation(record.round, self.strategy.personal)
        tasks = self._tasks(record.round, deadline, dict.fromkeys(devices, evaluate))
        self.evaluation.run(record.round, tasks, deadline, stop)

    def _tasks(self, round: int, deadline: float, work: Mapping[str, Mapping[str, Any]]) -> dict[str, Task]:
        """One task per device on the latest global model, with that device's work."""
        return device_tasks.make_tasks(
            round,
            deadline,
            work,
            model=device_tasks.latest_weights(self.store, self.config.precision, self._current),
            spec=self.model.spec_of(self._current),
            definition=self.model.definition,
            config=self.config,
            learning_rate=self._learning_rate(round),
            teacher=self._teacher,
        )

    @property
    def _current(self) -> Arrays:
        """The global weights devices train now."""
        return self.inbox.current

    def _wait_for_devices(self, stop: threading.Event) -> list[str]:
        while not stop.is_set():
            registered = self.store.registered()
            ready = [d for d in self.link.online() if d in registered]
            if len(ready) >= max(self.config.min_devices, self.strategy.needs.min_devices):
                return ready
            stop.wait(0.25)
        return []

    def _complete(
        self, round: int, arrays: Arrays, tally: RoundTally, teacher: Arrays | None = None
    ) -> RoundRecord:
        """Grow if the next round is deeper, then store and announce a new global model."""
        arrays = self._grown_for(round + 1, arrays)
        record, teacher_at = round_storage.store_round(self.store, self.model, round, arrays, tally, teacher)
        self.inbox.publish(arrays, self.model.spec_of(arrays))
        self._teacher = teacher_at or self._teacher
        self.link.announce(round_storage.announcement(self.store, self.model, record, arrays))
        return record

    def _learning_rate(self, round: int) -> float:
        """The devices' learning rate in a round, on the configured schedule."""
        c = self.config
        return learning_rate_for_round(round, c.rounds, c.learning_rate, c.final_lr_fraction)

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
