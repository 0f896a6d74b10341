"""The device daemon: learn the task, load local data, register, then train or evaluate each task it is sent.

It keeps its token and the coordinator's pinned key in its own state folder, takes only tasks and
withdrawals signed by that key, acknowledges each task over HTTP as it arrives (its round waits for this
device from then on), reports at once a task it could not do (its round stops waiting for it), and stops
for good (Refused) if the coordinator refuses it, revoked it (asked every minute while idle) or names
another key. A bad file in its data folder is skipped with one line, never a reason to stop. With a model
directory it also keeps the latest global model there as ONNX, for `fedspeech listen`, and in its state
folder the newest round it saw announced, below which it never goes.
"""

import functools
import hashlib
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from fedspeech.edge_client.coordinator_http import CoordinatorClient
from fedspeech.edge_client.credentials import DeviceCredentials, Refused
from fedspeech.edge_client.local_data import MAX_MIXED_TAKES, DataSource, LocalData, SyntheticMix
from fedspeech.edge_client.local_norm import LocalNorm
from fedspeech.edge_client.model_keeper import ModelKeeper
from fedspeech.edge_client.mqtt_link import BrokerLink
from fedspeech.edge_client.profile import measure_profile, measure_rtt_ms
from fedspeech.edge_client.task_work import Device, clip_counts, device_status, do_task, register_again
from fedspeech.edge_client.trainer import Trainer
from fedspeech.edge_client.validation_share import share_validation_clips
from fedspeech.protocol import bounds, routes, signing
from fedspeech.protocol.messages import Task
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import DEFAULT_ROOT, Topics
from fedspeech.runtime.announcements import FLOOR_FILE, Floor
from fedspeech.runtime.http_requests import Dropped, https_context

log = logging.getLogger(__name__)

MAX_SECRET_CHARS = 256
MAX_SHARED_CLIPS = 100
TOKEN_CHECK_S = 60.0  # between two checks that the coordinator still takes the token (not revoked)


@dataclass
class ClientConfig:
    """Where the coordinator and broker are, who this device is, whom it trusts, which data it trains on."""

    coordinator_url: str
    broker: BrokerSettings
    device_id: str
    data: DataSource
    state_dir: Path  # its own folder: its token (0600), the coordinator's key, its kept normalisation
    topic_root: str = DEFAULT_ROOT
    max_samples: int | None = None
    torch_threads: int = 1
    model_dir: Path | None = None  # where the latest global model is kept as ONNX (None: not kept)
    enrolment_secret: str | None = None  # printed by `fedspeech devices add` on the coordinator
    enrolment_secret_file: Path | None = None  # where it was read from, named when it is refused
    share_validation: int = 0  # training clips sent to the coordinator for validation (0: none, ever)
    mix_synthetic: int = 0  # synthetic takes of each word trained on beside its own clips (0: none)
    coordinator_key: str | None = None  # base64 Ed25519 key to pin (None: the kept one, else the first named)
    coordinator_ca: Path | None = None  # the CA of an HTTPS coordinator's certificate (None: the system's)
    make_trainer: Callable[[str, int], Trainer] = Trainer  # (device_id, torch_threads) -> its trainer
    token_check_s: float = TOKEN_CHECK_S  # how often an idle device asks whether it was revoked

    def check(self) -> None:
        """ValueError, in words a user can act on, for settings that cannot work."""
        if not bounds.DEVICE_ID.match(self.device_id):
            raise ValueError(
                f"device id {self.device_id!r}: use 1 to 64 ASCII letters, digits, '_', '.' or '-'"
            )
        try:
            routes.url(self.coordinator_url, routes.STATUS)  # an http:// or https:// URL
        except ValueError:
            raise ValueError(
                f"{self.coordinator_url!r} is not a coordinator's URL: give http(s)://HOST:PORT"
            ) from None
        self.broker.check()
        https_context(self.coordinator_ca)
        if self.coordinator_key is not None:
            signing.parse_public_key(self.coordinator_key)
        secret = self.enrolment_secret
        if secret is not None and not (0 < len(secret) <= MAX_SECRET_CHARS and secret.isascii()):
            raise ValueError(f"the enrolment secret must be 1 to {MAX_SECRET_CHARS} ASCII characters")
        if secret is not None and not all(c.isprintable() and not c.isspace() for c in secret):
            raise ValueError("the enrolment secret holds spaces or control characters")
        if not 0 <= self.share_validation <= MAX_SHARED_CLIPS:
            raise ValueError(f"share at most {MAX_SHARED_CLIPS} clips for validation")
        if not 0 <= self.mix_synthetic <= MAX_MIXED_TAKES:
            raise ValueError(
                f"mix in 0 to {MAX_MIXED_TAKES} synthetic takes a word, not {self.mix_synthetic}"
            )
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"the most clips to train on must be at least 1, got {self.max_samples}")
        if self.torch_threads < 1:
            raise ValueError(f"torch threads must be at least 1, got {self.torch_threads}")
        if not 0.1 <= self.token_check_s <= 86_400:
            raise ValueError(f"the token check's period must be 0.1 s to a day, got {self.token_check_s}")
        self.data.check()


def run_client(config: ClientConfig, stop: threading.Event | None = None) -> None:
    """Run the device daemon until stop is set or SIGTERM/SIGINT arrives, then go offline cleanly.

    ValueError for settings that cannot work (ClientConfig.check), Refused if the coordinator
    refuses this device or is not the one it trusts.
    """
    config.check()
    stop = stop or threading.Event()
    restore = _install_signal_handlers(stop)
    try:
        _run(config, stop)
    finally:
        restore()


def run_clients(configs: list[ClientConfig]) -> None:
    """Run several devices in this process, one thread each, until SIGTERM/SIGINT; all go offline cleanly.

    For emulating fleets larger than the machine has room for processes: the devices share the
    process' CPU and its torch import, and each is otherwise a device of its own. A device that cannot
    go on (Refused) stops alone; the first such error is raised once all have stopped.
    """
    for config in configs:
        config.check()
    stop = threading.Event()
    restore = _install_signal_handlers(stop)
    errors: list[Refused] = []

    def run(config: ClientConfig) -> None:
        try:
            _run(config, stop)
        except Refused as exc:
            log.error("%s stopped: %s", config.device_id, exc)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,), name=c.device_id) for c in configs]
    try:
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            stop.wait(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        restore()
    if errors:
        raise errors[0]


def _install_signal_handlers(stop: threading.Event) -> Callable[[], None]:
    """Turn SIGTERM/SIGINT into stop (main thread only); return a function that restores the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: stop.set())

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def _run(config: ClientConfig, stop: threading.Event) -> None:
    """The device's life: learn the task, warm up, register, go online, do tasks until stopped."""
    context = https_context(config.coordinator_ca)
    credentials = DeviceCredentials(config.state_dir, config.coordinator_key)
    source = str(config.enrolment_secret_file or "--enrolment-secret-file")
    http = CoordinatorClient(
        config.coordinator_url, config.device_id, stop, credentials, config.enrolment_secret, context, source
    )
    info = http.task_info()
    if info is None:
        return
    data = LocalData(config.data, config.max_samples, _mix(config))
    try:
        data.refresh(info.definition)
    except OSError as exc:  # the folder itself: each task reads it again, and reports the error it meets
        log.warning("%s: %s; it is read again for each task", config.device_id, exc)
    _log_data(data, config)
    local_norm = LocalNorm(config.state_dir)  # FedBN's layers or SiloBN's statistics, kept across restarts
    trainer = config.make_trainer(config.device_id, config.torch_threads)
    trainer.stop = stop  # training ends between two batches once the daemon is stopping
    trainer.local_norm = local_norm
    seconds_per_sample = trainer.warm_up(info.spec, data.train)
    profile = replace(
        measure_profile(),
        seconds_per_sample=seconds_per_sample,
        rtt_ms=measure_rtt_ms(config.coordinator_url, context=context),
    )
    registered = clip_counts(data, info.secure_aggregation)
    if stop.is_set() or not http.register(registered[0], profile, registered[1]):
        return
    if config.share_validation > 0:
        register = functools.partial(http.register, registered[0], profile, registered[1])
        share_validation_clips(http, data.train, config.share_validation, info.definition.labels, register)
    assert credentials.key is not None  # pinned by the registration
    topics = Topics(config.topic_root)
    arrived: queue.Queue[Task] = queue.Queue()  # tasks to acknowledge
    keeper = None
    if config.model_dir is not None:  # the newest round seen announced is kept beside the device's token
        floor = Floor(config.state_dir / FLOOR_FILE, signing.public_key_text(credentials.key), topics.model)
        keeper = ModelKeeper(config.model_dir, local_norm, topic=topics.model, floor=floor)
    link = BrokerLink(
        credentials.broker_login(config.broker, config.device_id),
        topics,
        config.device_id,
        credentials.key,
        on_announcement=keeper.offer if keeper is not None else None,
        on_connected=keeper.recheck if keeper is not None else None,
        on_task=arrived.put,
    )
    device = Device(
        config.device_id,
        config.coordinator_url,
        http,
        data,
        trainer,
        link,
        profile,
        registered,
        info.secure_aggregation,
    )
    done = threading.Event()
    acks = threading.Thread(target=_acknowledge, args=(http, link, arrived, done), name="acks", daemon=True)
    acks.start()
    link.start(device_status(device, "online"))
    next_check = time.monotonic() + config.token_check_s
    try:
        while not stop.is_set():
            if keeper is not None:
                keeper.keep(http)
            if time.monotonic() >= next_check:  # a revoked device is sent no task: it asks (Refused)
                http.check_token(functools.partial(register_again, device))
                next_check = time.monotonic() + config.token_check_s
            try:
                task = link.tasks.get(timeout=0.5)
            except queue.Empty:
                continue
            do_task(device, task)
    finally:
        done.set()
        link.go_offline()


def _acknowledge(
    http: CoordinatorClient, link: BrokerLink, arrived: queue.Queue[Task], done: threading.Event
) -> None:
    """Acknowledge each task as it arrives, until done: on a thread of its own, as the main loop may be busy
    with another task. A task the coordinator no longer wants is dropped.
    """
    while not done.is_set():
        try:
            task = arrived.get(timeout=0.5)
        except queue.Empty:
            continue
        try:
            http.acknowledge(task)
        except Dropped as exc:
            log.info("task %s of round %d is not wanted: %s", task.task_id, task.round, exc)
            link.withdraw(task)


def _mix(config: ClientConfig) -> SyntheticMix | None:
    """The synthetic takes the device mixes in, drawn by a seed of its own id, if any."""
    if not config.mix_synthetic:
        return None
    seed = int.from_bytes(hashlib.sha256(config.device_id.encode()).digest()[:4], "big")
    return SyntheticMix(config.mix_synthetic, config.state_dir / "synthetic", seed)


def _log_data(data: LocalData, config: ClientConfig) -> None:
    train, test = data.train.counts, data.test.counts
    log.info(
        "%s: %d training and %d test clips from %s; per label %s",
        config.device_id,
        sum(train.values()),
        sum(test.values()),
        config.data.describe(),
        {label: train.get(label, 0) + test.get(label, 0) for label in train.keys() | test.keys()},
    )
    if not train:
        log.warning("%s has no usable training clips yet: it will train once it has some", config.device_id)
