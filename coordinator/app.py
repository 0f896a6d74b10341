"""Flask app factory: builds the coordinator service from configuration; `serve` serves its HTTP API."""

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flask import Flask

import fedspeech.coordinator.http.operator_api  # noqa: F401  # adds the operator's routes to api's blueprint
from fedspeech.coordinator.broker import broker_users
from fedspeech.coordinator.broker.embedded import EmbeddedBroker
from fedspeech.coordinator.broker.mqtt_link import CoordinatorLink, TopicRootTaken
from fedspeech.coordinator.config import APP_KEY, CoordinatorConfig, EvaluationConfig, ServiceConfig
from fedspeech.coordinator.fleet.enrolment import Enrolment
from fedspeech.coordinator.fleet.shared_validation import SharedValidation
from fedspeech.coordinator.http.api import bp as api_bp
from fedspeech.coordinator.http.dashboard import bp as dashboard_bp
from fedspeech.coordinator.http.metrics import bp as metrics_bp
from fedspeech.coordinator.http.openapi import APP_KEY as OPENAPI_KEY
from fedspeech.coordinator.http.openapi import bp as openapi_bp
from fedspeech.coordinator.http.openapi import describe
from fedspeech.coordinator.http.server import HttpServer, serve
from fedspeech.coordinator.http.wrong_tokens import GuessLimit
from fedspeech.coordinator.model.global_model import GlobalModel
from fedspeech.coordinator.model.pretraining import Pretraining, init_in_words, start_weights
from fedspeech.coordinator.round.orchestrator import Orchestrator
from fedspeech.coordinator.round.upload_outcomes import UploadOutcomes
from fedspeech.coordinator.round.uploads import Uploads
from fedspeech.coordinator.state.store import StateError, Store, holds_state
from fedspeech.protocol import signing
from fedspeech.protocol.files import write_atomically
from fedspeech.protocol.messages import TaskDefinition
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import COORDINATOR_USER, Topics

__all__ = ["HttpServer", "Service", "TopicRootTaken", "create_app", "serve"]

log = logging.getLogger(__name__)

CHECK_TOPIC_ROOT_S = 10.0  # the longest start waits for the broker to show what its topic root holds


@dataclass
class Service:
    """Everything the coordinator runs: store, broker link, round loop, uploads, optional embedded broker."""

    store: Store
    link: CoordinatorLink
    orchestrator: Orchestrator
    enrolment: Enrolment
    key: Ed25519PrivateKey  # signs tasks and model announcements
    broker_url: str
    broker: EmbeddedBroker | None = None
    shared_validation: SharedValidation | None = None  # clips devices share, where the operator takes them
    admin_token: str | None = None  # None: the fleet's state is readable by anyone who reaches the API
    admin_guesses: GuessLimit = field(default_factory=GuessLimit)  # wrong admin tokens per address
    outcomes: UploadOutcomes = field(default_factory=UploadOutcomes)
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    @property
    def uploads(self) -> Uploads:
        """Where request threads hand in devices' uploads and ask about the round being trained."""
        return self.orchestrator.uploads

    def start(self) -> None:
        """Start the embedded broker (if any), the MQTT link and the round loop.

        TopicRootTaken, with nothing left running, if another coordinator announces on the topic root.
        """
        if self.broker is not None:
            self.broker.start()
        self.link.start()
        try:
            self.link.check_topic_root(CHECK_TOPIC_ROOT_S)
        except TopicRootTaken:
            self.stop()
            raise
        self.thread = threading.Thread(
            target=self.orchestrator.run, args=(self.stop_event,), name="rounds", daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        """Stop the round loop, the link and the embedded broker."""
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=30)
        self.link.stop()
        if self.broker is not None:
            self.broker.stop()


def _global_model(config: CoordinatorConfig) -> GlobalModel:
    from fedspeech.models.clips.tasks import load_task, spec_for

    service = config.service
    definition = load_task(service.task)
    spec = spec_for(definition, service.model, service.depth)
    shared = None
    if service.shared_validation > 0:
        folder = service.state / "validation"
        shared = SharedValidation(folder, service.shared_validation, spec.num_samples, spec.num_classes)
    validation = (
        _folder_clips(service.validation_data, definition, "validation") if service.validation_data else None
    )
    server = _server_data(service.server_data, definition) if service.server_data else None
    heldout = _central_heldout(config.evaluation, definition)
    return GlobalModel(spec, definition, heldout, validation, server, shared)


def _load(
    clips: list[Any], skipped: list[Any], definition: TaskDefinition, purpose: str, source: str
) -> tuple[list[Any], np.ndarray]:
    """The clips that load, with their waveforms; each skip logged; ValueError if none is usable."""
    from fedspeech.models.clips.folders import ClipCache, shown

    kept, waveforms, bad = ClipCache().load(clips, definition.sample_rate, definition.num_samples)
    for skip in skipped + bad:
        log.warning("%s skips %s: %s", purpose, shown(skip.path), skip.reason)
    if not kept:
        raise ValueError(f"no usable clips for {purpose} in {source}")
    log.info("%s: %d clips from %s", purpose, len(kept), source)
    return kept, waveforms


def _folder_clips(folder: Path, definition: TaskDefinition, purpose: str) -> tuple[np.ndarray, np.ndarray]:
    """The waveforms and labels of a folder DIR/<label>/*."""
    from fedspeech.models.clips.folders import list_folder

    clips, skipped = list_folder(folder, definition.labels)
    kept, waveforms = _load(clips, skipped, definition, purpose, str(folder))
    return waveforms, np.array([clip.label for clip in kept], dtype=np.int64)


def _server_data(folder: Path, definition: TaskDefinition) -> tuple[np.ndarray, np.ndarray | None]:
    """Mutual distillation's server clips: labelled from DIR/<label>/*, else every file in DIR unlabelled."""
    from fedspeech.models.clips.datasets import Clip
    from fedspeech.models.clips.folders import MAX_FILES, list_folder

    clips, skipped = list_folder(folder, definition.labels)
    if clips:
        kept, waveforms = _load(clips, skipped, definition, "server data", str(folder))
        return waveforms, np.array([clip.label for clip in kept], dtype=np.int64)
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")][:MAX_FILES]
    _, waveforms = _load(
        [Clip(p, 0, "", False) for p in files], [], definition, "unlabelled server data", str(folder)
    )
    return waveforms, None


def _central_heldout(evaluation: EvaluationConfig, definition: TaskDefinition) -> tuple[Any, Any] | None:
    """The coordinator's own held-out waveforms and labels, if the operator gave any; else None."""
    from fedspeech.models.clips.datasets import Clip, load_corpus, server_test_clips
    from fedspeech.models.clips.folders import list_folder

    if evaluation.eval_data:
        clips, skipped = list_folder(evaluation.eval_data, definition.labels)
        source = str(evaluation.eval_data)
    elif evaluation.eval_corpus:
        corpus = load_corpus(evaluation.eval_corpus, evaluation.data_dir)
        missing = sorted(set(corpus.labels) - set(definition.labels))
        if missing:
            raise ValueError(f"corpus {corpus.name!r} has labels the task lacks: {missing}")
        clips = [
            Clip(c.path, definition.labels.index(corpus.labels[c.label]), c.speaker, True)
            for c in server_test_clips(corpus)
        ]
        skipped, source = [], f"the {corpus.name} held-out set"
    else:
        log.info("no central held-out set: the devices evaluate each model on their own test clips")
        return None
    kept, waveforms = _load(clips[: evaluation.eval_limit], skipped, definition, "central evaluation", source)
    return waveforms, np.array([clip.label for clip in kept], dtype=np.int64)


def create_app(config: CoordinatorConfig | None = None) -> Flask:
    """Build the coordinator app from its config (default: every setting's default), kept in app.config.

    ValueError (StateError for a state directory that cannot be used) says what is wrong, in one line.
    """
    config = config or CoordinatorConfig()
    service = config.service
    app = Flask(__name__, static_folder=None)  # no /static/ route: the dashboard serves its own files
    app.config[APP_KEY] = config
    app.config["MAX_CONTENT_LENGTH"] = service.max_content_length  # Flask's own bound on any body

    admin_token = _admin_token(service.admin_token_file)
    settings, broker = _broker(service)
    model = _global_model(config)  # a bad task stops the coordinator before its state is touched
    if not holds_state(service.state):
        log.info("a new coordinator state in %s: its database, keys and models are kept there", service.state)
    store = Store(service.state)
    store.check_writable()  # refused now, rather than at the first registration
    store.remove_unfinished_writes()
    key = _signing_key(store.dir)
    link = CoordinatorLink(settings, Topics(service.topic_root), key, take_over=service.take_over_topic_root)
    enrolment = Enrolment(store, service.open_enrolment, service.max_devices)
    orchestrator = Orchestrator(config.rounds, store, link, model)
    if store.latest_round() is None:  # a new fleet: its first model, trained or read here if asked
        fresh = orchestrator.first_model()
        start = start_weights(
            service.init, model.definition, model.spec_of(fresh), fresh, service.state, service.init_data,
            Pretraining(service.init_takes, service.init_epochs, seed=config.rounds.seed),
        )  # fmt: skip
        model.start, model.start_made_from = start, init_in_words(service.init, service.init_data)
    app.extensions["fedspeech"] = Service(
        store,
        link,
        orchestrator,
        enrolment,
        key,
        settings.url,
        broker,
        shared_validation=model.shared_validation,
        admin_token=admin_token,
    )
    app.register_blueprint(api_bp)  # the devices' routes, and the operator's that operator_api adds to it
    app.register_blueprint(dashboard_bp)
    app.register_blueprint(metrics_bp)
    app.register_blueprint(openapi_bp)
    app.extensions[OPENAPI_KEY] = describe(app)
    return app


# a token of chance, not a word: the right one is let in from any address, so that no one sharing the
# operator's address can lock the operator out, and only its length keeps it from being guessed
MIN_ADMIN_TOKEN_CHARS, MIN_ADMIN_TOKEN_DISTINCT = 32, 16


def _admin_token(path: Path | None) -> str | None:
    """The admin token in the file at path, or None without one; ValueError if it is unusable."""
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the admin token file {path}: {exc}") from None
    if (
        len(token) < MIN_ADMIN_TOKEN_CHARS
        or len(set(token)) < MIN_ADMIN_TOKEN_DISTINCT
        or any(c.isspace() or not c.isprintable() for c in token)
    ):
        raise ValueError(
            f"the admin token in {path} must be at least {MIN_ADMIN_TOKEN_CHARS} printable characters, "
            f"{MIN_ADMIN_TOKEN_DISTINCT} of them different, without spaces: make one with "
            "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )
    return token


def _broker(service: ServiceConfig) -> tuple[BrokerSettings, EmbeddedBroker | None]:
    """How to reach the broker, and the embedded one to start when no broker is configured."""
    files = (service.broker_password_file, service.broker_ca, service.broker_cert, service.broker_key)
    if not service.broker:
        if service.broker_username or any(files):
            raise ValueError(
                "broker credentials and certificates need a broker URL: the embedded one has none"
            )
        broker = EmbeddedBroker(service.embedded_broker_host, service.broker_port)
        return BrokerSettings(broker.url), broker
    password_file = service.broker_password_file
    if password_file is None and service.broker_username is None:
        password_file = broker_users.coordinator_password_file(service.state)
        if password_file is not None:
            log.info("logging in to the broker as %s with %s", COORDINATOR_USER, password_file)
    # a password file without a user name: the coordinator's own user on the broker
    username = service.broker_username or (COORDINATOR_USER if password_file else None)
    settings = BrokerSettings(service.broker, username, password_file, *files[1:])
    settings.check()
    return settings, None


def _signing_key(state_dir: Path) -> Ed25519PrivateKey:
    """The coordinator's signing key, state_dir/coordinator.key, with its public half in coordinator.pub."""
    path = state_dir / "coordinator.key"
    try:
        key = signing.load_or_create_key(path)
    except (ValueError, TypeError) as exc:
        raise StateError(
            f"{path} is not a usable signing key ({exc}): restore it from a backup; a new key (the file "
            "moved away) must then be given to every device that pinned the old one"
        ) from None
    public = state_dir / "coordinator.pub"  # for the operator to give devices (--coordinator-key)
    text = signing.public_key_text(key) + "\n"
    if not public.exists() or public.read_text() != text:
        write_atomically(public, text.encode())
    return key
