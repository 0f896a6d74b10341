"""The round loop: select devices, hand out tasks, collect and check updates, aggregate, store, announce."""

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fedspeech.coordinator import device_tasks, grouped_training, method_needs, round_storage
from fedspeech.coordinator.aggregate import rebased, server_momentum, without_breakers
from fedspeech.coordinator.chains import Chain
from fedspeech.coordinator.config import RoundConfig
from fedspeech.coordinator.errors import BadUpload, NotWanted
from fedspeech.coordinator.evaluation_phase import EvaluationPhase, evaluates, evaluation_plan
from fedspeech.coordinator.late_updates import LateUpdates
from fedspeech.coordinator.open_round import OpenRound
from fedspeech.coordinator.ports import DeviceLink, ModelOps
from fedspeech.coordinator.round_storage import RoundTally
from fedspeech.coordinator.scheduling import depth_for_round, learning_rate_for_round
from fedspeech.coordinator.server_side import CoordinatorClips
from fedspeech.coordinator.store import RoundRecord, StateWriteError, Store
from fedspeech.coordinator.strategies import Result, RoundPlan, make_strategy
from fedspeech.coordinator.update_check import answered_task, check_update, reported_samples
from fedspeech.models import depth_of
from fedspeech.protocol import weights
from fedspeech.protocol.messages import BlobRef, ModelSpec, Profile, Task
from fedspeech.protocol.weights import Arrays, WeightsError

log = logging.getLogger(__name__)

UNMEASURED = Profile(cpu_count=1, cpu_freq_mhz=0.0, ram_available_mb=0.0)  # a device that sent no profile
RETRY_S = 5.0  # before a round that failed is run again


class Orchestrator:
    """Runs rounds until the configured number is complete; restarts resume after the last stored round."""

    def __init__(self, config: RoundConfig, store: Store, link: DeviceLink, model: ModelOps) -> None:
        self.config, self.store, self.link, self.model = config, store, link, model
        self._lock = threading.Condition()
        self.strategy = make_strategy(config.strategy, config.k, config.epochs, config.strategy_options)
        self._local_names = method_needs.local_names(self.strategy, model)  # ValueError if unmet
        self._open: OpenRound | None = None
        self._late = LateUpdates()  # a buffered method's tasks past their round, and their updates
        self._teacher: BlobRef | None = None  # where devices download a strategy's second model
        self._clips = CoordinatorClips(model, config, self._full, self._learning_rate)
        self._velocity: Arrays | None = None  # server momentum's last step (a restart starts it again)
        self.evaluation = EvaluationPhase(store, link, model.spec.num_classes, config.eval_min_reports)
        self.settled_round = -1  # the last round whose model is stored and, where asked for, evaluated
        self._global: Arrays | None = None
        self.finished = threading.Event()
        self._depth(1)  # a bad depth schedule fails here, at start-up

    # -- called from HTTP handlers -------------------------------------------------------------

    def current_spec(self) -> ModelSpec:
        """The spec of the model devices train now: the global model's, or round 1's before there is one."""
        with self._lock:
            arrays = self._global
        return self.model.spec_at(self._depth(1)) if arrays is None else self.model.spec_of(arrays)

    def open_round(self) -> int | None:
        """The number of the round being trained, if any."""
        with self._lock:
            return self._open.round if self._open else None

    def count_download(self, model_round: int, nbytes: int) -> None:
        """Count a global-model download against the open round it serves."""
        with self._lock:
            if self._open is not None and model_round == self._open.round - 1:
                self._open.bytes_down += nbytes

    def receive_update(self, round: int, device_id: str, body: bytes, digest: str) -> None:
        """Check a device's upload and keep it for aggregation; BadUpload or NotWanted say why not.

        Only an accepted update counts as the round's upload traffic.
        """
        try:
            weights.check_digest(body, digest)
            arrays, meta = weights.decode(body)
        except WeightsError as exc:
            raise BadUpload(str(exc)) from None
        with self._lock:
            open_, global_ = self._open, self._global
            task = answered_task(open_, self._late, round, device_id, meta, self.strategy.mode == "buffered")
        if global_ is None:
            raise NotWanted("the coordinator has no global model yet")
        reference = self._shared(global_)
        status, device = self.link.statuses().get(device_id), self.store.device(device_id)
        reported = reported_samples(status, device, self.config.max_device_samples)
        num_classes = self.model.spec.num_classes
        result, record, claimed = check_update(
            arrays, meta, reference, task, reported, num_classes, digest, device_id
        )
        if record.num_samples < claimed:
            log.warning(
                "round %d: %s claims %d samples; counted as %d (its reported count, at most %d)",
                round, device_id, claimed, record.num_samples, self.config.max_device_samples,
            )  # fmt: skip
        with self._lock:
            if self._late.carried.get(device_id) is task:  # late: it counts in the open round or the next
                self._late.accept(task, result, record, len(body))
                if self._open is not None:
                    self._late.count_in(self._open)
            elif self._open is not open_ or open_ is None or device_id in open_.updates:
                raise NotWanted(f"round {round} closed while the update was checked")
            else:
                open_.updates[device_id] = (result, record)
                open_.bytes_up += len(body)
            self._lock.notify_all()
        log.info("round %d: update from %s accepted (%d samples)", round, device_id, record.num_samples)

    def receive_evaluation(self, round: int, device_id: str, body: bytes) -> None:
        """Check a device's evaluation report and keep it; BadUpload or NotWanted say why not."""
        self.evaluation.receive(round, device_id, body)

    # -- the loop -------------------------------------------------------------------------------

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
            self._global = weights.decode(data)[0]
            teacher = self.store.model_path(latest.round, "teacher")
            if self.strategy.needs.server_data and teacher.exists():  # a server model, as a teacher
                blob = teacher.read_bytes()
                self.strategy.restore(weights.decode(blob)[0])
                self._teacher = round_storage.teacher_address(latest.round, blob)
            log.info("resuming after round %d", latest.round)
            self.link.announce(round_storage.announcement(self.store, self.model, latest, self._global))
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
            not open_.chains and time.time() >= open_.deadline and not self._all_in(open_)
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
            stragglers=len(missing & online - self._late.carried.keys()),
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
        with self._lock:
            self._open = OpenRound(round, started, deadline, tasks, plan.needed, frozenset(plan.required))
            self._late.count_in(self._open)
        for device, task in tasks.items():
            self.link.publish_task(task, device)
        with self._lock:
            while not stop.is_set() and time.time() < deadline and not self._all_in(self._open):
                self._lock.wait(timeout=0.25)
            open_, self._open = self._open, None
            if self.strategy.mode == "buffered":  # who has not answered trains on; its update counts later
                self._late.carry(open_)
            done = (open_.tasks.keys() | open_.updates.keys()) - self._late.carried.keys()
        for device in sorted(done):
            self.link.clear_task(device)
        return open_

    def _still_training(self, ready: Sequence[str]) -> set[str]:
        """The devices busy with an earlier round's task, once the tasks no longer wanted are dropped."""
        spec = self.model.spec_of(self._current)
        with self._lock:
            dropped = self._late.drop(ready, spec, time.time())
            busy = self._late.busy()
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
        base = weights.with_precision(self._shared(trained_from), self.config.precision)
        base = weights.with_precision(base, "float32")
        try:
            arrays = rebased(result.arrays, base, self._shared(self._current))
        except ValueError as exc:
            log.warning("round %d: dropped the late update of %s: %s", round, result.device_id, exc)
            return None
        return replace(result, arrays=arrays)

    def _train_in_groups(
        self, round: int, plan: RoundPlan, started: float, stop: threading.Event
    ) -> OpenRound:
        """Each group's devices train one after another, each from the last good update before it.

        Groups run side by side; the round ends when every group is through (see grouped_training).
        """
        chains = [Chain(list(group)) for group in plan.groups]
        open_ = OpenRound(round, started, started, {}, len(chains), frozenset(), chains=chains)

        def make_task(device: str) -> Task:
            deadline = time.time() + self.config.round_timeout_s
            work = device_tasks.training(self.config, round, plan, device)
            return self._tasks(round, deadline, {device: work})[device]

        with self._lock:
            self._open = open_
        grouped_training.train_in_groups(open_, self._lock, self.link, self.store, make_task, stop)
        with self._lock:
            self._open = None
        for chain in chains:
            if chain.current is not None:
                self.link.clear_task(chain.current)
        return open_

    def relay_file(self, round: int, step: int, device_id: str) -> Path:
        """The relayed update a device's open task trains from; NotWanted for anyone else."""
        with self._lock:
            grouped_training.count_relay_download(self._open, round, step, device_id)
        return self.store.relay_path(round, step)

    def _aggregate(self, round: int, results: Sequence[Result]) -> tuple[Arrays, list[Result]] | None:
        """The strategy's new global weights and the results in them; None if no result can be aggregated.

        Results that break the aggregation on their own (it raises, or gives weights that are not finite)
        are dropped, and the others aggregated without them.
        """
        shared = self._shared(self._current)
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

    def _shared(self, arrays: Arrays) -> Arrays:
        """The arrays devices send: all but the normalisation layers a method keeps on the devices."""
        return {name: a for name, a in arrays.items() if name not in self._local_names}

    def _full(self, shared: Arrays) -> Arrays:
        """Shared arrays completed with the global model's own normalisation layers."""
        return {**{name: self._current[name] for name in self._local_names}, **shared}

    def _evaluate_on_devices(self, record: RoundRecord, stop: threading.Event) -> None:
        """Ask online devices to evaluate the round's model on their test splits; store what they report."""
        registered = self.store.registered()
        online = [d for d in self.link.online() if d in registered]
        with self._lock:
            training = {d: task.deadline for d, task in self._late.carried.items()}
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
        if self._global is None:
            raise RuntimeError("no global model yet")
        return self._global

    def _all_in(self, open_: OpenRound) -> bool:
        """Whether the round has its needed results and its required devices, or all devices still online."""
        online = set(self.link.online())
        # a buffered method's devices still training for earlier rounds may answer in this one too
        answered = [d in open_.updates or d not in online for d in (*open_.tasks, *self._late.carried)]
        required_in = all(d in open_.updates or d not in online for d in open_.required)
        return all(answered) or (required_in and open_.optional_results() >= open_.needed)

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
        self._global = arrays
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
