"""The device daemon: register, listen for tasks over MQTT, train on local data, upload the weights.

With a model directory it also keeps the latest global model there as ONNX, for `fedspeech listen`.
"""

import http.client
import json
import logging
import os
import queue
import random
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from fedspeech.edge_client.profile import measure_profile, measure_rtt_ms
from fedspeech.protocol import messages, weights
from fedspeech.protocol.messages import (
    BlobRef,
    Credentials,
    DeviceStatus,
    ModelAnnouncement,
    ModelSpec,
    Profile,
    Registration,
    Task,
)
from fedspeech.protocol.topics import DEFAULT_ROOT, Topics, parse_broker_url

log = logging.getLogger(__name__)

DOWNLOAD_ATTEMPTS = 4
HTTP_TIMEOUT = 60.0
WARM_UP_SAMPLES = 32
WARM_UP_BATCH = 16  # the coordinator's default, so the first seconds per sample is comparable


@dataclass
class ClientConfig:
    """Where the coordinator and broker are, who this device is and which local data it trains on."""

    coordinator_url: str
    broker_url: str
    device_id: str
    corpus: str
    speaker: str
    data_dir: Path | None = None
    topic_root: str = DEFAULT_ROOT
    max_samples: int | None = None
    torch_threads: int = 1
    model_dir: Path | None = None  # where the latest global model is kept as ONNX (None: not kept)


@dataclass
class _Reply:
    status: int
    body: bytes


@dataclass
class _Daemon:
    """Everything the daemon keeps between tasks; shared with the MQTT thread only through queue and sets."""

    config: ClientConfig
    stop: threading.Event
    topics: Topics
    clips: list[Any]
    profile: Profile
    token: str = ""
    status: DeviceStatus | None = None
    client: mqtt.Client | None = None
    tasks: queue.Queue[Task] = field(default_factory=queue.Queue)
    seen_tasks: set[str] = field(default_factory=set)
    withdrawn: set[str] = field(default_factory=set)  # tasks whose round closed before they were done
    waveforms: dict[tuple[int, int], tuple[Any, Any]] = field(default_factory=dict)
    model: tuple[ModelSpec, Any] | None = None
    status_lock: threading.Lock = field(default_factory=threading.Lock)
    announced: ModelAnnouncement | None = None  # the newest global model announced (set by MQTT thread)
    kept_round: int = -1  # round of the ONNX model kept in model_dir


class _Drop(Exception):
    """The current task cannot be done; the text says why."""


def run_client(config: ClientConfig, stop: threading.Event | None = None) -> None:
    """Run the device daemon until stop is set or SIGTERM/SIGINT arrives, then go offline cleanly."""
    stop = stop or threading.Event()
    restore = _install_signal_handlers(stop)
    try:
        _run(config, stop)
    finally:
        restore()


def run_clients(configs: list[ClientConfig]) -> None:
    """Run several devices in this process, one thread each, until SIGTERM/SIGINT; all go offline cleanly.

    For emulating fleets larger than the machine has room for processes: the devices share the
    process' CPU and its torch import, and each is otherwise a device of its own.
    """
    stop = threading.Event()
    restore = _install_signal_handlers(stop)
    threads = [threading.Thread(target=_run, args=(c, stop), name=c.device_id) for c in configs]
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
    corpus, clips = _train_clips(config)
    daemon = _Daemon(config, stop, Topics(config.topic_root), clips, measure_profile())
    seconds_per_sample = _warm_up(daemon, corpus)
    rtt_ms = measure_rtt_ms(config.coordinator_url)
    daemon.profile = replace(daemon.profile, seconds_per_sample=seconds_per_sample, rtt_ms=rtt_ms)
    if not _register(daemon):
        return
    daemon.status = DeviceStatus(config.device_id, "online", len(clips), daemon.profile)
    daemon.kept_round = _kept_round(config.model_dir)
    _connect(daemon)
    try:
        while not stop.is_set():
            _keep_latest_model(daemon)
            try:
                task = daemon.tasks.get(timeout=0.5)
            except queue.Empty:
                continue
            _do_task(daemon, task)
    finally:
        _go_offline(daemon)


def _train_clips(config: ClientConfig) -> tuple[Any, list[Any]]:
    """The corpus and the speaker's training clips, capped at max_samples."""
    from fedspeech.models.datasets import client_clips, load_corpus

    corpus = load_corpus(config.corpus, config.data_dir)
    train, _ = client_clips(corpus, config.speaker)
    return corpus, train[: config.max_samples] if config.max_samples is not None else train


def _warm_up(daemon: _Daemon, corpus: Any) -> float | None:
    """Load torch, the model and the local audio before going online; return a first seconds per sample.

    A slow device spends a minute here; done before registering, it is not charged to its first round.
    The figure comes from training the real model briefly on a few local clips (the second of two passes,
    so one-off allocation is not counted); the first real task replaces it.
    """
    from fedspeech.models.datasets import default_spec
    from fedspeech.models.train import train_local

    if not daemon.clips:
        return None
    spec = default_spec(corpus)
    model = _model(daemon, spec)
    waveforms, labels = _waveforms(daemon, spec)
    few = slice(0, WARM_UP_SAMPLES)
    for _ in range(2):
        result = train_local(
            model, waveforms[few], labels[few], epochs=1, batch_size=WARM_UP_BATCH, learning_rate=0.0
        )
    log.info("warmed up: %d clips loaded, %.4f s per training sample", len(labels), result.seconds_per_sample)
    return result.seconds_per_sample


# ---- HTTP ----


def _http(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = HTTP_TIMEOUT,
) -> _Reply:
    """One HTTP request; any status is a reply, connection problems raise OSError or HTTPException."""
    request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return _Reply(response.status, response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return _Reply(exc.code, exc.read())


_CONNECTION_ERRORS = (OSError, http.client.HTTPException)


def _backoff(first: float = 0.5, maximum: float = 10.0) -> Iterator[float]:
    """Delays doubling from first up to maximum, each with random jitter so devices do not retry in step."""
    delay = first
    while True:
        yield random.uniform(delay / 2, delay)
        delay = min(delay * 2, maximum)


def _error_reason(reply: _Reply) -> str:
    try:
        return str(json.loads(reply.body)["error"])
    except (ValueError, KeyError, TypeError):
        return reply.body[:200].decode(errors="replace") or f"HTTP {reply.status}"


def _register(daemon: _Daemon) -> bool:
    """Post the registration until the coordinator answers; False if stopped first, RuntimeError on a 4xx."""
    config = daemon.config
    body = messages.encode(Registration(config.device_id, len(daemon.clips), daemon.profile))
    url = f"{config.coordinator_url.rstrip('/')}/api/devices"
    for attempt, delay in enumerate(_backoff(), start=1):
        if daemon.stop.is_set():
            return False
        try:
            reply = _http("POST", url, body, {"Content-Type": "application/json"}, timeout=10.0)
            if reply.status == 200:
                daemon.token = messages.decode(reply.body, Credentials).token
                log.info("registered %s with %s (%d samples)", config.device_id, url, len(daemon.clips))
                return True
            if 400 <= reply.status < 500:  # asking again will not change the answer
                raise RuntimeError(f"the coordinator rejected the registration: {_error_reason(reply)}")
            reason = f"HTTP {reply.status}: {_error_reason(reply)}"
        except _CONNECTION_ERRORS as exc:
            reason = str(exc)
        except messages.ProtocolError as exc:
            reason = f"bad credentials: {exc}"
        log.info("registration attempt %d failed (%s); retrying in %.1f s", attempt, reason, delay)
        daemon.stop.wait(delay)
    return False


# ---- MQTT ----


def _connect(daemon: _Daemon) -> None:
    """An MQTT client that reconnects by itself, subscribes to the task topic and keeps the status current."""
    config = daemon.config
    host, port = parse_broker_url(config.broker_url)
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=config.device_id)
    offline = messages.encode(DeviceStatus(config.device_id, "offline"))
    client.will_set(daemon.topics.status(config.device_id), offline, qos=1, retain=True)
    client.reconnect_delay_set(min_delay=1, max_delay=30)

    def on_connect(client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.warning("broker %s refused the connection: %s", config.broker_url, reason_code)
            return
        log.info("connected to broker %s", config.broker_url)
        client.subscribe(daemon.topics.task(config.device_id), qos=1)
        if config.model_dir is not None:
            client.subscribe(daemon.topics.model, qos=1)
        _publish_status(daemon)

    def on_disconnect(client, userdata, flags, reason_code, properties) -> None:
        if not daemon.stop.is_set():
            log.info("disconnected from broker (%s); reconnecting", reason_code)

    client.on_connect = on_connect
    client.on_disconnect = on_disconnect
    # Routed by topic, not on_message: some brokers (amqtt 0.12) also send retained messages of topics
    # this client never subscribed to.
    client.message_callback_add(
        daemon.topics.task(config.device_id),
        lambda client, userdata, message: _on_task_message(daemon, message.payload),
    )
    if config.model_dir is not None:
        client.message_callback_add(
            daemon.topics.model, lambda client, userdata, message: _on_announcement(daemon, message.payload)
        )
    daemon.client = client  # before connecting: on_connect publishes through it
    client.connect_async(host, port)
    client.loop_start()


def _publish_status(daemon: _Daemon, status: DeviceStatus | None = None) -> mqtt.MQTTMessageInfo | None:
    """Remember the status (re-sent on every reconnect) and publish it retained."""
    topic = daemon.topics.status(daemon.config.device_id)
    with daemon.status_lock:  # the MQTT thread re-publishes on reconnect: keep the newest status last
        if status is not None:
            daemon.status = status
        if daemon.client is None or daemon.status is None:
            return None
        return daemon.client.publish(topic, messages.encode(daemon.status), qos=1, retain=True)


def _on_task_message(daemon: _Daemon, payload: bytes) -> None:
    """Queue a valid, new, unexpired task; log and drop anything else (runs on the MQTT thread)."""
    if not payload:
        # The coordinator clears the task when its round closes: whatever is not done yet is not wanted,
        # and uploading it would only cost the device's bandwidth.
        daemon.withdrawn.update(daemon.seen_tasks)
        return
    try:
        task = messages.decode(payload, Task)
    except messages.ProtocolError as exc:
        log.warning("dropping malformed task: %s", exc)
        return
    if task.task_id in daemon.seen_tasks:
        return  # re-delivered after a reconnect
    if task.deadline < time.time():
        log.info("ignoring task %s of round %d: its deadline has passed", task.task_id, task.round)
        return
    daemon.seen_tasks.add(task.task_id)
    daemon.tasks.put(task)


def _on_announcement(daemon: _Daemon, payload: bytes) -> None:
    """Remember a valid model announcement; the main loop fetches its ONNX (runs on the MQTT thread)."""
    try:
        announcement = messages.decode(payload, ModelAnnouncement)
    except messages.ProtocolError as exc:
        log.warning("dropping malformed model announcement: %s", exc)
        return
    if announcement.onnx is not None:
        daemon.announced = announcement


def _go_offline(daemon: _Daemon) -> None:
    """Publish the retained offline status, wait for the broker to take it, disconnect."""
    client = daemon.client
    if client is None:
        return
    info = _publish_status(daemon, DeviceStatus(daemon.config.device_id, "offline"))
    if info is not None and client.is_connected():
        try:
            info.wait_for_publish(timeout=5)
        except (ValueError, RuntimeError) as exc:
            log.warning("could not publish the offline status: %s", exc)
    client.disconnect()
    client.loop_stop()
    log.info("%s offline", daemon.config.device_id)


# ---- tasks ----


def _do_task(daemon: _Daemon, task: Task) -> None:
    """Download, train and upload one task; whatever happens, report online again afterwards."""
    config = daemon.config
    seconds_per_sample = daemon.profile.seconds_per_sample
    try:
        if task.deadline < time.time():
            raise _Drop("its deadline passed while it was queued")
        _check_wanted(daemon, task)
        training = DeviceStatus(config.device_id, "training", len(daemon.clips), daemon.profile, task.round)
        _publish_status(daemon, training)
        data = _fetch(daemon, task.weights)
        arrays, _ = weights.decode(data)
        model = _model(daemon, task.spec)
        result, upload = _train(daemon, model, arrays, task)
        _check_wanted(daemon, task)
        _upload(daemon, task, upload)
        seconds_per_sample = result.seconds_per_sample
        log.info(
            "round %d done: %d samples, loss %.4f, %.1f s, %d B down, %d B up",
            task.round,
            result.num_samples,
            result.loss,
            result.seconds,
            len(data),
            len(upload),
        )
    except (_Drop, weights.WeightsError) as exc:
        log.warning("dropping task %s of round %d: %s", task.task_id, task.round, exc)
    except Exception:
        log.exception("task %s of round %d failed", task.task_id, task.round)
    daemon.profile = measure_profile(seconds_per_sample, measure_rtt_ms(config.coordinator_url))
    _publish_status(daemon, DeviceStatus(config.device_id, "online", len(daemon.clips), daemon.profile))


# ---- the latest global model, kept as ONNX ----

_KEPT_MODEL, _KEPT_ANNOUNCEMENT = "model.onnx", "model.json"


def _kept_round(model_dir: Path | None) -> int:
    """Round of the model kept in model_dir by an earlier run, -1 if none."""
    if model_dir is None:
        return -1
    try:
        return messages.decode((model_dir / _KEPT_ANNOUNCEMENT).read_bytes(), ModelAnnouncement).round
    except (OSError, messages.ProtocolError):
        return -1


def _keep_latest_model(daemon: _Daemon) -> None:
    """Download the newest announced ONNX model into model_dir if it is newer than the one kept."""
    announcement, model_dir = daemon.announced, daemon.config.model_dir
    if model_dir is None or announcement is None or announcement.round <= daemon.kept_round:
        return
    try:
        data = _fetch(daemon, announcement.onnx)
    except (_Drop, weights.WeightsError) as exc:
        log.warning("not keeping the model of round %d: %s", announcement.round, exc)
        daemon.kept_round = announcement.round  # not retried until a newer one is announced
        return
    model_dir.mkdir(parents=True, exist_ok=True)
    _write_atomically(model_dir / _KEPT_MODEL, data)
    _write_atomically(model_dir / _KEPT_ANNOUNCEMENT, messages.encode(announcement))
    daemon.kept_round = announcement.round
    log.info("kept the global model of round %d in %s", announcement.round, model_dir / _KEPT_MODEL)


def _write_atomically(path: Path, data: bytes) -> None:
    """Write data to path so that a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _check_wanted(daemon: _Daemon, task: Task) -> None:
    """Raise _Drop if the coordinator withdrew the task (its round took the results it needed)."""
    if task.task_id in daemon.withdrawn:
        raise _Drop("the coordinator withdrew it: its round closed")


def _fetch(daemon: _Daemon, ref: BlobRef) -> bytes:
    """A blob from the coordinator, digest checked; retried a few times on connection errors."""
    url = f"{daemon.config.coordinator_url.rstrip('/')}{ref.path}"
    for attempt, delay in enumerate(_backoff(), start=1):
        try:
            reply = _http("GET", url)
            break
        except _CONNECTION_ERRORS as exc:
            if attempt == DOWNLOAD_ATTEMPTS or daemon.stop.is_set():
                raise _Drop(f"cannot download {url}: {exc}") from None
            log.info("download attempt %d of %s failed (%s); retrying in %.1f s", attempt, url, exc, delay)
            daemon.stop.wait(delay)
    if reply.status != 200:
        raise _Drop(f"download of {url} answered HTTP {reply.status}: {_error_reason(reply)}")
    weights.check_digest(reply.body, ref.sha256)
    return reply.body


def _model(daemon: _Daemon, spec: ModelSpec) -> Any:
    """The model for a spec, built once and reused while the spec stays the same."""
    if daemon.model is None or daemon.model[0] != spec:
        import torch

        from fedspeech.models import build_model

        torch.set_num_threads(daemon.config.torch_threads)
        daemon.model = (spec, build_model(spec))
    return daemon.model[1]


def _train(daemon: _Daemon, model: Any, arrays: weights.Arrays, task: Task) -> tuple[Any, bytes]:
    """Train from the given weights on local data; return the result and the encoded weights to upload."""
    from fedspeech.models.train import get_arrays, set_arrays, train_local

    weights.check_like(arrays, get_arrays(model))
    waveforms, labels = _waveforms(daemon, task.spec)
    set_arrays(model, arrays)
    result = train_local(
        model,
        waveforms,
        labels,
        epochs=task.epochs,
        batch_size=task.batch_size,
        learning_rate=task.learning_rate,
        seed=task.seed,
        proximal_mu=task.proximal_mu,
    )
    metadata = {
        "task_id": task.task_id,
        "device_id": daemon.config.device_id,
        "num_samples": str(result.num_samples),
        "train_loss": str(result.loss),
        "train_seconds": str(result.seconds),
        "seconds_per_sample": str(result.seconds_per_sample),
    }
    return result, weights.encode(get_arrays(model), metadata=metadata)


def _waveforms(daemon: _Daemon, spec: ModelSpec) -> tuple[Any, Any]:
    """The local clips as waveforms and labels at the spec's rate and length, loaded once per shape."""
    from fedspeech.models.datasets import load_waveforms

    key = (spec.sample_rate, spec.num_samples)
    if key not in daemon.waveforms:
        daemon.waveforms[key] = load_waveforms(daemon.clips, *key)
    return daemon.waveforms[key]


def _upload(daemon: _Daemon, task: Task, body: bytes) -> None:
    """Post the trained weights; re-register once on 401, retry connection errors until the deadline."""
    url = f"{daemon.config.coordinator_url.rstrip('/')}{task.upload_path}"
    registered_again = False
    delays = _backoff()
    while True:
        if daemon.stop.is_set():
            raise _Drop("stopping")
        headers = {
            "Authorization": f"Bearer {daemon.token}",
            "Content-Type": "application/octet-stream",
            "X-Content-SHA256": weights.sha256(body),
        }
        try:
            reply = _http("POST", url, body, headers)
        except _CONNECTION_ERRORS as exc:
            reason = str(exc)
        else:
            if reply.status == 200:
                return
            if reply.status == 401 and not registered_again:
                log.info("the coordinator does not know our token; registering again")
                registered_again = True
                if not _register(daemon):
                    raise _Drop("stopped while registering again")
                continue
            if reply.status == 409:
                raise _Drop(f"the coordinator no longer wants it: {_error_reason(reply)}")
            if reply.status < 500:
                raise _Drop(f"upload rejected with HTTP {reply.status}: {_error_reason(reply)}")
            reason = f"HTTP {reply.status}: {_error_reason(reply)}"
        delay = next(delays)
        if time.time() + delay > task.deadline:
            raise _Drop(f"upload failed ({reason}) and the deadline is near")
        log.info("upload to %s failed (%s); retrying in %.1f s", url, reason, delay)
        daemon.stop.wait(delay)
