"""Flask app factory: builds the coordinator service from configuration; `serve` serves its HTTP API."""

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flask import Flask

from fedspeech.coordinator.api import MAX_UPDATE_BYTES
from fedspeech.coordinator.api import bp as api_bp
from fedspeech.coordinator.broker import EmbeddedBroker
from fedspeech.coordinator.config import RoundConfig
from fedspeech.coordinator.dashboard import bp as dashboard_bp
from fedspeech.coordinator.enrolment import MAX_DEVICES, Enrolment
from fedspeech.coordinator.global_model import GlobalModel
from fedspeech.coordinator.http_server import HttpServer, serve
from fedspeech.coordinator.metrics import bp as metrics_bp
from fedspeech.coordinator.mqtt_link import CoordinatorLink
from fedspeech.coordinator.orchestrator import Orchestrator
from fedspeech.coordinator.shared_validation import SharedValidation
from fedspeech.coordinator.store import StateError, Store
from fedspeech.coordinator.upload_outcomes import UploadOutcomes
from fedspeech.protocol import signing
from fedspeech.protocol.files import write_atomically
from fedspeech.protocol.messages import TaskDefinition
from fedspeech.protocol.mqtt import BrokerSettings
from fedspeech.protocol.topics import DEFAULT_ROOT, Topics

__all__ = ["DEFAULTS", "HttpServer", "Service", "create_app", "serve"]

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "STATE_DIR": "fedspeech-state",
    "BROKER_URL": None,  # None: start an embedded broker on EMBEDDED_BROKER_HOST:PORT (plain mqtt://)
    # how the coordinator logs in to its broker (BrokerSettings)
    "BROKER_USERNAME": None,
    "BROKER_PASSWORD_FILE": None,
    "BROKER_CA": None,
    "BROKER_CERT": None,
    "BROKER_KEY": None,
    "EMBEDDED_BROKER_HOST": "127.0.0.1",
    "EMBEDDED_BROKER_PORT": 1883,
    # who may register: only devices enrolled with a secret, or anyone (demo, emulated fleets) up to a cap
    "OPEN_ENROLMENT": False,
    "MAX_DEVICES": MAX_DEVICES,
    # the HTTP server (http_server.serve): HTTPS when both TLS files are given
    "HTTP_THREADS": 16,
    "HTTP_TIMEOUT_S": 30.0,
    "TLS_CERT": None,
    "TLS_KEY": None,
    # a file holding the operator's token: with it, the dashboard, /metrics and the device and round
    # listings answer only its holder, and devices can be revoked over HTTP
    "ADMIN_TOKEN_FILE": None,
    "MAX_CONTENT_LENGTH": MAX_UPDATE_BYTES,  # Flask's bound on any body; each route has its own below it
    "TOPIC_ROOT": DEFAULT_ROOT,
    "TASK": "fsdd",  # a built-in task (fsdd, emodb, speech_commands) or the path of a task file
    # central evaluation, besides the federated one: a folder DIR/<label>/* or a corpus' held-out set
    "EVAL_DATA": None,
    "EVAL_CORPUS": None,
    "DATA_DIR": None,  # where EVAL_CORPUS lives; None: the bundled data/ folder
    "EVAL_LIMIT": None,  # cap on central held-out clips, None for all
    # the coordinator's own clips for two methods: quality-weighted aggregation scores each update on
    # VALIDATION_DATA (DIR/<label>/*); mutual distillation trains its server model on SERVER_DATA
    # (DIR/<label>/*, or a folder of unlabelled clips)
    "VALIDATION_DATA": None,
    "SERVER_DATA": None,
    "SHARED_VALIDATION": 0,  # clips a device may share for validation (fedspeech client --share-validation)
    "MODEL": None,  # an architecture in fedspeech.models.MODELS; None: the task's default
    "MODEL_DEPTH": None,  # a transformer's full-grown depth, None for models.MAX_DEPTH
    # every RoundConfig field, upper-cased: ROUNDS, MIN_DEVICES, ..., STRATEGY, K, DEPTH_SCHEDULE:
    **{f.name.upper(): getattr(RoundConfig(), f.name) for f in fields(RoundConfig)},
}


@dataclass
class Service:
    """Everything the coordinator runs: store, broker link, orchestrator thread, optional embedded broker."""

    store: Store
    link: CoordinatorLink
    orchestrator: Orchestrator
    enrolment: Enrolment
    key: Ed25519PrivateKey  # signs tasks and model announcements
    broker_url: str
    broker: EmbeddedBroker | None = None
    shared_validation: SharedValidation | None = None  # clips devices share, where the operator takes them
    admin_token: str | None = None  # None: the fleet's state is readable by anyone who reaches the API
    outcomes: UploadOutcomes = field(default_factory=UploadOutcomes)
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the embedded broker (if any), the MQTT link and the round loop."""
        if self.broker is not None:
            self.broker.start()
        self.link.start()
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


def _round_config(config: Mapping[str, Any]) -> RoundConfig:
    """The RoundConfig fields from the app's upper-case settings, each cast to its default's type."""
    defaults = RoundConfig()
    return RoundConfig(
        **{f.name: type(getattr(defaults, f.name))(config[f.name.upper()]) for f in fields(RoundConfig)}
    )


def _global_model(config: Mapping[str, Any]) -> GlobalModel:
    from fedspeech.models.clips.tasks import load_task, spec_for

    definition = load_task(config["TASK"])
    spec = spec_for(definition, config["MODEL"], config["MODEL_DEPTH"])
    shared = None
    if int(config["SHARED_VALIDATION"]) > 0:
        folder = Path(config["STATE_DIR"]) / "validation"
        shared = SharedValidation(
            folder, int(config["SHARED_VALIDATION"]), spec.num_samples, spec.num_classes
        )
    validation = (
        _folder_clips(config["VALIDATION_DATA"], definition, "validation")
        if config["VALIDATION_DATA"]
        else None
    )
    server = _server_data(Path(config["SERVER_DATA"]), definition) if config["SERVER_DATA"] else None
    return GlobalModel(spec, definition, _central_heldout(config, definition), validation, server, shared)


def _load(
    clips: list[Any], skipped: list[Any], definition: TaskDefinition, purpose: str, source: str
) -> tuple[list[Any], np.ndarray]:
    """The clips that load, with their waveforms; each skip logged; ValueError if none is usable."""
    from fedspeech.models.clips.folders import ClipCache

    kept, waveforms, bad = ClipCache().load(clips, definition.sample_rate, definition.num_samples)
    for skip in skipped + bad:
        log.warning("%s skips %s: %s", purpose, skip.path, skip.reason)
    if not kept:
        raise ValueError(f"no usable clips for {purpose} in {source}")
    log.info("%s: %d clips from %s", purpose, len(kept), source)
    return kept, waveforms


def _folder_clips(folder: str, definition: TaskDefinition, purpose: str) -> tuple[np.ndarray, np.ndarray]:
    """The waveforms and labels of a folder DIR/<label>/*."""
    from fedspeech.models.clips.folders import list_folder

    clips, skipped = list_folder(Path(folder), definition.labels)
    kept, waveforms = _load(clips, skipped, definition, purpose, folder)
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


def _central_heldout(config: Mapping[str, Any], definition: TaskDefinition) -> tuple[Any, Any] | None:
    """The coordinator's own held-out waveforms and labels, if the operator gave any; else None."""
    from fedspeech.models.clips.datasets import Clip, load_corpus, server_test_clips
    from fedspeech.models.clips.folders import list_folder

    if config["EVAL_DATA"] and config["EVAL_CORPUS"]:
        raise ValueError("central evaluation takes EVAL_DATA or EVAL_CORPUS, not both")
    if config["EVAL_DATA"]:
        clips, skipped = list_folder(Path(config["EVAL_DATA"]), definition.labels)
        source = config["EVAL_DATA"]
    elif config["EVAL_CORPUS"]:
        data_dir = Path(config["DATA_DIR"]) if config["DATA_DIR"] else None
        corpus = load_corpus(config["EVAL_CORPUS"], data_dir)
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
    kept, waveforms = _load(clips[: config["EVAL_LIMIT"]], skipped, definition, "central evaluation", source)
    return waveforms, np.array([clip.label for clip in kept], dtype=np.int64)


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """Build the coordinator app: defaults, then FEDSPEECH_* environment variables, then `config`.

    ValueError (StateError for a state directory that cannot be used) says what is wrong, in one line.
    """
    app = Flask(__name__)
    app.config.from_mapping(DEFAULTS)
    app.config.from_prefixed_env("FEDSPEECH")
    if config:
        app.config.from_mapping(config)

    round_config = _round_config(app.config)
    admin_token = _admin_token(app.config["ADMIN_TOKEN_FILE"])
    settings, broker = _broker(app.config)
    model = _global_model(app.config)  # a bad task stops the coordinator before its state is touched
    store = Store(Path(app.config["STATE_DIR"]))
    store.remove_unfinished_writes()
    key = _signing_key(store.dir)
    link = CoordinatorLink(settings, Topics(app.config["TOPIC_ROOT"]), key)
    enrolment = Enrolment(store, bool(app.config["OPEN_ENROLMENT"]), int(app.config["MAX_DEVICES"]))
    orchestrator = Orchestrator(round_config, store, link, model)
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
    app.register_blueprint(api_bp)
    app.register_blueprint(dashboard_bp)
    app.register_blueprint(metrics_bp)
    return app


MIN_ADMIN_TOKEN_CHARS = 16


def _admin_token(path: str | None) -> str | None:
    """The admin token in the file at path, or None without one; ValueError if it is unusable."""
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the admin token file {path}: {exc}") from None
    if len(token) < MIN_ADMIN_TOKEN_CHARS or any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(
            f"the admin token in {path} must be at least {MIN_ADMIN_TOKEN_CHARS} printable characters "
            "without spaces: make one with `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )
    return token


def _broker(config: Mapping[str, Any]) -> tuple[BrokerSettings, EmbeddedBroker | None]:
    """How to reach the broker, and the embedded one to start when no broker is configured."""
    login = ("BROKER_USERNAME", "BROKER_PASSWORD_FILE", "BROKER_CA", "BROKER_CERT", "BROKER_KEY")
    if not config["BROKER_URL"]:
        if any(config[name] for name in login):
            raise ValueError(
                "broker credentials and certificates need a broker URL: the embedded one has none"
            )
        broker = EmbeddedBroker(config["EMBEDDED_BROKER_HOST"], int(config["EMBEDDED_BROKER_PORT"]))
        return BrokerSettings(broker.url), broker
    paths = [Path(config[name]) if config[name] else None for name in login[1:]]
    username = config["BROKER_USERNAME"] or ("coordinator" if config["BROKER_PASSWORD_FILE"] else None)
    settings = BrokerSettings(config["BROKER_URL"], username, *paths)
    settings.check()
    return settings, None


def _signing_key(state_dir: Path) -> Ed25519PrivateKey:
    """The coordinator's signing key, STATE_DIR/coordinator.key, with its public half in coordinator.pub."""
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
