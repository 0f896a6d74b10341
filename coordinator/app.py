"""Flask app factory: builds the coordinator service from configuration and serves its HTTP API."""

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from flask import Flask
from werkzeug.serving import BaseWSGIServer, make_server

from fedspeech.coordinator.api import bp as api_bp
from fedspeech.coordinator.broker import EmbeddedBroker
from fedspeech.coordinator.global_model import GlobalModel
from fedspeech.coordinator.mqtt_link import CoordinatorLink
from fedspeech.coordinator.orchestrator import Orchestrator, RoundConfig
from fedspeech.coordinator.store import Store
from fedspeech.protocol.messages import TaskDefinition
from fedspeech.protocol.topics import DEFAULT_ROOT, Topics

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "STATE_DIR": "fedspeech-state",
    "BROKER_URL": None,  # None: start an embedded broker on EMBEDDED_BROKER_HOST:PORT
    "EMBEDDED_BROKER_HOST": "127.0.0.1",
    "EMBEDDED_BROKER_PORT": 1883,
    "TOPIC_ROOT": DEFAULT_ROOT,
    "TASK": "fsdd",  # a built-in task (fsdd, emodb, speech_commands) or the path of a task file
    # central evaluation, besides the federated one: a folder DIR/<label>/* or a corpus' held-out set
    "EVAL_DATA": None,
    "EVAL_CORPUS": None,
    "DATA_DIR": None,  # where EVAL_CORPUS lives; None: the bundled data/ folder
    "EVAL_LIMIT": None,  # cap on central held-out clips, None for all
    "MODEL": "cnn",  # an architecture in fedspeech.models.MODELS
    "MODEL_DEPTH": None,  # a transformer's full-grown depth, None for models.MAX_DEPTH
    # every RoundConfig field, upper-cased: ROUNDS, MIN_DEVICES, ..., STRATEGY, K, DEPTH_SCHEDULE:
    **{f.name.upper(): f.default for f in fields(RoundConfig)},
}


@dataclass
class Service:
    """Everything the coordinator runs: store, broker link, orchestrator thread, optional embedded broker."""

    store: Store
    link: CoordinatorLink
    orchestrator: Orchestrator
    broker_url: str
    broker: EmbeddedBroker | None = None
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
    from fedspeech.models.tasks import load_task, spec_for

    definition = load_task(config["TASK"])
    spec = spec_for(definition, config["MODEL"], config["MODEL_DEPTH"])
    return GlobalModel(spec, definition, _central_heldout(config, definition))


def _central_heldout(config: Mapping[str, Any], definition: TaskDefinition) -> tuple[Any, Any] | None:
    """The coordinator's own held-out waveforms and labels, if the operator gave any; else None."""
    from fedspeech.models.datasets import Clip, load_corpus, server_test_clips
    from fedspeech.models.folders import ClipCache, list_folder

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
    kept, waveforms, bad = ClipCache().load(
        clips[: config["EVAL_LIMIT"]], definition.sample_rate, definition.num_samples
    )
    for skip in skipped + bad:
        log.warning("central evaluation skips %s: %s", skip.path, skip.reason)
    if not kept:
        raise ValueError(f"no usable clips for central evaluation in {source}")
    log.info("central held-out set: %d clips from %s", len(kept), source)
    return waveforms, np.array([clip.label for clip in kept], dtype=np.int64)


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """Build the coordinator app: defaults, then FEDSPEECH_* environment variables, then `config`."""
    app = Flask(__name__)
    app.config.from_mapping(DEFAULTS)
    app.config.from_prefixed_env("FEDSPEECH")
    if config:
        app.config.from_mapping(config)

    broker = None
    broker_url = app.config["BROKER_URL"]
    if not broker_url:
        broker = EmbeddedBroker(app.config["EMBEDDED_BROKER_HOST"], int(app.config["EMBEDDED_BROKER_PORT"]))
        broker_url = broker.url
    store = Store(Path(app.config["STATE_DIR"]))
    link = CoordinatorLink(broker_url, Topics(app.config["TOPIC_ROOT"]))
    orchestrator = Orchestrator(_round_config(app.config), store, link, _global_model(app.config))
    app.extensions["fedspeech"] = Service(store, link, orchestrator, broker_url, broker)
    app.register_blueprint(api_bp)
    return app


def serve(app: Flask, host: str, port: int) -> BaseWSGIServer:
    """Serve the app from a background thread; returns the server (its port is server.server_port)."""
    server = make_server(host, port, app, threaded=True)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log.info("coordinator HTTP API on http://%s:%d", host, server.server_port)
    return server
