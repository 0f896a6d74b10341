"""The coordinator's settings, typed and bounded: its service, how rounds run, and its central evaluation.

Each setting is a field with its default; a value out of bounds is refused where the config is made, with
one line naming it. Field names are unique across the three parts, so that a setting has one name in a
config file, an environment variable (FEDSPEECH_ROUNDS), an option of `fedspeech coordinator` (--rounds)
and `CoordinatorConfig.changed` (config_sources reads the files, variables and options).
"""

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from fedspeech.coordinator.fleet.enrolment import MAX_DEVICES
from fedspeech.coordinator.strategies import StrategyParams, make_strategy, strategy_class
from fedspeech.coordinator.strategies.aggregate import MOST_OVER_MEDIAN
from fedspeech.coordinator.strategies.differential_privacy import PrivacySettings, privacy_settings
from fedspeech.models.architectures import MODELS, NEW_BLOCKS
from fedspeech.models.clips.datasets import CORPORA
from fedspeech.protocol import bounds
from fedspeech.protocol.topics import DEFAULT_ROOT
from fedspeech.protocol.weights import PRECISIONS, Precision

APP_KEY = "FEDSPEECH"  # the CoordinatorConfig in the Flask app's config
DEFAULT_ACK_TIMEOUT_S = 10.0  # how long a device has to acknowledge its task
MAX_ACK_TIMEOUT_S = 600.0
MAX_HTTP_TIMEOUT_S = 3600.0
NORM_BOUNDS = ("median", "off")  # or a positive number: a fixed bound
NormBound = float | Literal["median", "off"]


def _at_least(name: str, value: int | None, low: int) -> None:
    """ValueError unless value (None: unset) is at least low."""
    if value is not None and value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")


def _at_most(name: str, value: int, high: int) -> None:
    """ValueError unless value is at most high."""
    if value > high:
        raise ValueError(f"{name} must be at most {high}, got {value}")


def _port(name: str, value: int) -> None:
    """ValueError unless value is a port to listen on, or 0 for any free one."""
    if not 0 <= value <= 65535:
        raise ValueError(f"{name} must be a port number, 1 to 65535 (0: any free one), got {value}")


def norm_bound_value(text: str | float) -> NormBound:
    """A norm bound as given (text, or a number in a config file): "median", "off" or a positive number;
    ValueError else.
    """
    if text in NORM_BOUNDS:
        return text  # type: ignore[return-value]  # one of the Literal's words
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    check_norm_bound(value)
    return value


def check_norm_bound(bound: NormBound) -> None:
    """ValueError unless bound is "median", "off" or a positive number."""
    if bound not in NORM_BOUNDS and not (isinstance(bound, float) and 0 < bound < math.inf):
        raise ValueError(f"norm_bound must be median, off or a positive number, got {bound!r}")


@dataclass(frozen=True)
class ServiceConfig:
    """What the coordinator keeps and serves, where: its state, broker, HTTP server, task and model."""

    state: Path = Path("fedspeech-state")  # the folder of what outlives a restart
    # make a folder that holds no coordinator state one (else refused: a mistyped --state would quietly
    # start a new fleet); a state that exists is used either way
    new_state: bool = False
    # an existing broker's URL, mqtt:// or mqtts://; None: start an embedded broker on
    # embedded_broker_host:broker_port
    broker: str | None = None
    # how the coordinator logs in to its broker; with a password file and no user name, as "coordinator"
    broker_username: str | None = None
    broker_password_file: Path | None = None
    broker_ca: Path | None = None
    broker_cert: Path | None = None
    broker_key: Path | None = None
    embedded_broker_host: str = "127.0.0.1"
    broker_port: int = 1883
    # who may register: only devices enrolled with a secret, or anyone (demo, emulated fleets) up to a cap
    open_enrolment: bool = False
    max_devices: int = MAX_DEVICES
    # the HTTP server (http.server.serve): HTTPS when both TLS files are given
    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port
    # requests handled at a time, each only once it has arrived whole: a slow client never holds one
    http_threads: int = 16
    # the longest a request may take to arrive, headers and body, from its connection's opening (or its
    # previous answer); and the longest its answer may take to be read
    http_timeout: float = 30.0  # seconds
    http_connections_per_client: int = 32  # connections one address may hold open; more are closed at once
    # connections held open at once from all addresses, more closed at once: within the limit of open files
    # (raised as far as the hard limit allows), less what the rest of the coordinator needs
    http_connections: int = 4096
    # bytes of request bodies held at once, across requests; a body that would pass it is refused (503)
    http_body_budget: int = 4 * bounds.MAX_BLOB_BYTES
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # a file holding the operator's token: with it, the dashboard, /metrics and the device and round
    # listings answer only its holder, and devices can be revoked over HTTP
    admin_token_file: Path | None = None
    # Flask's bound on any body (the largest update, api.MAX_UPDATE_BYTES); each route has its own below it
    max_content_length: int = bounds.MAX_BLOB_BYTES
    topic_root: str = DEFAULT_ROOT
    # announce on a topic root whose retained announcement another coordinator signed (it is gone)
    take_over_topic_root: bool = False
    task: str = "fsdd"  # a built-in task (fsdd, emodb, speech_commands) or the path of a task file
    model: str | None = None  # an architecture in fedspeech.models.MODELS; None: the task's default
    depth: int | None = None  # a transformer's full-grown depth, None for models.MAX_DEPTH
    # the coordinator's own clips for two methods: quality-weighted aggregation scores each update on
    # validation_data (DIR/<label>/*); mutual distillation trains its server model on server_data
    # (DIR/<label>/*, or a folder of unlabelled clips)
    validation_data: Path | None = None
    server_data: Path | None = None
    # a new fleet's first model: random, synthetic (trained on the task's words spoken by the machine's
    # synthesizers) or a safetensors file; init_data, a folder DIR/<label>/* of speech to train it on too
    init: str = "random"
    init_data: Path | None = None
    init_takes: int = 300  # synthetic takes of each word
    init_epochs: int = 12  # of training the first model
    shared_validation: int = (
        0  # clips a device may share for validation (fedspeech client --share-validation)
    )

    def __post_init__(self) -> None:
        _port("broker_port", self.broker_port)
        _port("port", self.port)
        for name, low in (("max_devices", 1), ("http_threads", 1), ("max_content_length", 1)):
            _at_least(name, getattr(self, name), low)
        _at_least("shared_validation", self.shared_validation, 0)
        for name, high in (("init_takes", 5000), ("init_epochs", 1000)):
            _at_least(name, getattr(self, name), 1)
            _at_most(name, getattr(self, name), high)
        _at_least("depth", self.depth, 1)
        _at_least("http_connections_per_client", self.http_connections_per_client, 1)
        _at_least("http_connections", self.http_connections, 1)
        # the largest upload must fit the budget, or it could never be taken
        _at_least("http_body_budget", self.http_body_budget, bounds.MAX_BLOB_BYTES)
        for name, high in (
            ("http_threads", 256),
            ("http_connections_per_client", 65536),
            ("http_connections", 1_000_000),
        ):
            _at_most(name, getattr(self, name), high)
        _at_most("http_body_budget", self.http_body_budget, 2**40)
        if not 0 < self.http_timeout <= MAX_HTTP_TIMEOUT_S:
            raise ValueError(
                f"http_timeout must be a positive number of seconds, at most {MAX_HTTP_TIMEOUT_S:g}, "
                f"got {self.http_timeout}"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both, or neither for plain HTTP")
        if self.model is not None and self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")


@dataclass(frozen=True)
class RoundConfig:
    """How rounds run."""

    rounds: int = 10
    min_devices: int = 2
    min_results: int = 2
    round_timeout: float = 120.0  # seconds a device has to send its update
    # once half a round's devices (and min_results) have uploaded, the others have this many times the time
    # that took (at least 2 s) before the round closes without them: on pi-mix a Pi 3 (3.5 x the time half
    # the fleet took) makes it in time, a device that takes its task and never answers costs a few seconds
    straggler_grace: float = 3.0
    # a device that has not acknowledged its task this long (seconds) after it is absent for it: a round
    # never waits its deadline for a device that only looks online
    ack_timeout: float = DEFAULT_ACK_TIMEOUT_S
    epochs: int = 2
    batch_size: int = 16
    lr: float = 3e-3  # the devices' learning rate
    # the last round's learning rate as a fraction of the first's, reached along a cosine (1: constant)
    final_lr_fraction: float = 1.0
    # server momentum on the aggregate's step, FedAvgM (0: none)
    server_momentum: float = 0.0
    seed: int = 0
    strategy: str = "fedavg"  # a name in coordinator.strategies.STRATEGIES
    # devices aggregated per round by top-K and random-K strategies; the results a fedbuff round closes on
    k: int = 3
    # a transformer's depth by round: constant, linear (in depth_stages stages, 0: one block per stage)
    # or a list of depths such as "1,2,4"; see scheduling.depth_for_round
    depth_schedule: str = "linear"
    depth_stages: int = 0
    new_blocks: str = "fresh"  # how a block added by growth starts: fresh, or copied from the one below
    precision: Precision = "float32"  # of the weights devices download and upload; float16 halves the bytes
    # federated evaluation of the new global model on the devices' own test splits
    eval_every: int = 1  # every N rounds (and always the last); 0: never
    eval_devices: int = 0  # devices asked, sampled from those online; 0: all of them
    eval_timeout: float = 60.0  # seconds devices have to report an evaluation
    eval_min_reports: int = 1  # fewer reports than this give no federated scores
    # An update's weight: at most the samples its device registered (over HTTP, with its token), growing by
    # at most sample_growth a round from what it last counted for, at most samples_over_median times the
    # fleet's median count, and at most max_device_samples. An MQTT status never sets it.
    max_device_samples: int = 100_000
    sample_growth: float = 0.25
    samples_over_median: float = MOST_OVER_MEDIAN
    # each update's change to the global model is bounded in L2 norm before the strategy combines it
    # (influence.norm_bounded): "median" (norm_bound_factor times the round's median change), a fixed
    # norm such as 5.0, or "off"
    norm_bound: NormBound = "median"
    norm_bound_factor: float = 2.0
    # a change whose cosine with the mean of the round's other changes is not positive is left out
    # (influence.without_opposed); not under differential privacy or secure aggregation (start_notes)
    direction_check: bool = True
    # the strategy's own settings: its Params (strategies.strategy_params makes them from name=value
    # texts); None: its defaults
    strategy_settings: StrategyParams | None = None
    # user-level differential privacy around the strategy (strategies.differential_privacy), on when any
    # is given: each is a setting of PrivacySettings, unset ones at its defaults; without
    # dp_noise_multiplier, the least noise that keeps all the rounds within dp_epsilon
    dp_noise_multiplier: float | None = None
    dp_norm_bound: float | None = None
    dp_delta: float | None = None
    dp_epsilon: float | None = None
    dp_sampling_rate: float | None = None
    dp_norm_bound_quantile: float | None = None
    dp_norm_bound_learning_rate: float | None = None
    # the settings above made once, with their noise calibrated: what the round loop is given
    privacy: PrivacySettings | None = field(init=False, default=None, repr=False, compare=False)
    # the coordinator learns only the sum of a round's updates (round.modes.secure_sum): each device's change
    # bounded to L2 norm secure_norm_bound; a secret rebuilt from secure_threshold of the round's devices
    # (at least 2); the keys agreed within secure_keys_timeout seconds, the sum unmasked within as long again
    secure_aggregation: bool = False
    secure_norm_bound: float = 10.0
    secure_threshold: float = 0.5
    secure_keys_timeout: float = 30.0

    def __post_init__(self) -> None:
        ranges = [
            ("epochs", self.epochs, 1, bounds.MAX_EPOCHS),
            ("batch_size", self.batch_size, 1, bounds.MAX_BATCH_SIZE),
            ("lr", self.lr, 1e-12, bounds.MAX_LEARNING_RATE),
            ("round_timeout", self.round_timeout, 1e-3, bounds.MAX_TASK_SECONDS),
            ("straggler_grace", self.straggler_grace, 0.0, 1000.0),
            ("ack_timeout", self.ack_timeout, 0.1, MAX_ACK_TIMEOUT_S),
            ("eval_timeout", self.eval_timeout, 1e-3, bounds.MAX_TASK_SECONDS),
            ("max_device_samples", self.max_device_samples, 1, bounds.MAX_COUNT),
            ("final_lr_fraction", self.final_lr_fraction, 1e-6, 1.0),
            ("server_momentum", self.server_momentum, 0.0, 0.99),
            ("sample_growth", self.sample_growth, 0.0, 100.0),
            ("samples_over_median", self.samples_over_median, 1.0, 1000.0),
            ("norm_bound_factor", self.norm_bound_factor, 1.0, 100.0),
            ("secure_norm_bound", self.secure_norm_bound, 1e-6, 1e6),
            ("secure_threshold", self.secure_threshold, 0.01, 1.0),
            ("secure_keys_timeout", self.secure_keys_timeout, 0.1, bounds.MAX_TASK_SECONDS),
        ]
        for name, value, low, high in ranges:
            if not low <= value <= high:  # also refuses NaN
                raise ValueError(
                    f"{name} must be between {low:g} and {high:g} (a task's bounds), got {value}"
                )
        # the counts the command line bounds, bounded here too for a file's or a variable's
        # rounds: at least 1, for 0 would only serve the initial model, which no one asks for
        counts = [("rounds", 1), ("min_devices", 1), ("min_results", 1), ("k", 1), ("depth_stages", 0)]
        counts += [("eval_every", 0), ("eval_devices", 0), ("eval_min_reports", 1)]
        for name, low in counts:
            _at_least(name, getattr(self, name), low)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.new_blocks not in NEW_BLOCKS:
            raise ValueError(f"new_blocks must be one of {', '.join(NEW_BLOCKS)}, got {self.new_blocks!r}")
        check_norm_bound(self.norm_bound)
        params = strategy_class(self.strategy).Params  # refuses an unknown name
        if self.strategy_settings is not None and not isinstance(self.strategy_settings, params):
            raise ValueError(f"strategy_settings are not {self.strategy}'s ({params.__qualname__})")
        given = {name[3:]: getattr(self, name) for name in DP_FIELDS if getattr(self, name) is not None}
        try:
            privacy = privacy_settings(given, self.rounds)
        except ValueError as exc:
            raise ValueError(f"dp_{exc}") from None
        if privacy is not None:  # refuses a strategy privacy cannot wrap, before anything starts
            make_strategy(self.strategy, self.k, self.epochs, self.strategy_settings, privacy)
        object.__setattr__(self, "privacy", privacy)  # frozen: made once, here


@dataclass(frozen=True)
class EvaluationConfig:
    """The coordinator's central evaluation, besides the federated one: a folder of clips or a corpus'."""

    eval_data: Path | None = None  # a folder DIR/<label>/* of clips
    eval_corpus: str | None = None  # or the held-out set of a corpus: fsdd, emodb, speech_commands
    data_dir: Path | None = None  # where eval_corpus lives; None: the bundled data/ folder
    eval_limit: int | None = None  # at most this many clips; None: all

    def __post_init__(self) -> None:
        if self.eval_data is not None and self.eval_corpus is not None:
            raise ValueError("central evaluation takes eval_data or eval_corpus, not both")
        if self.eval_corpus is not None and self.eval_corpus not in CORPORA:
            raise ValueError(f"eval_corpus must be one of {', '.join(CORPORA)}, got {self.eval_corpus!r}")
        _at_least("eval_limit", self.eval_limit, 1)


@dataclass(frozen=True)
class CoordinatorConfig:
    """Everything the coordinator is configured with, made once: its service, rounds and evaluation."""

    service: ServiceConfig = field(default_factory=ServiceConfig)
    rounds: RoundConfig = field(default_factory=RoundConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)

    def changed(self, **settings: Any) -> "CoordinatorConfig":
        """A copy with these settings, each named by its field in whichever part holds it.

        Each part is made again once, with dataclasses.replace: its bounds are checked on the new
        values together. ValueError for a name no part has.
        """
        parts: dict[str, dict[str, Any]] = {}
        if settings.get("strategy", self.rounds.strategy) != self.rounds.strategy:  # at its own defaults
            settings = {"strategy_settings": None, **settings}
        for name, value in settings.items():
            if name not in SECTION_OF:
                raise ValueError(f"no setting {name!r}")
            parts.setdefault(SECTION_OF[name], {})[name] = value
        return replace(self, **{part: replace(getattr(self, part), **v) for part, v in parts.items()})


SECTIONS: dict[str, type] = {"service": ServiceConfig, "rounds": RoundConfig, "evaluation": EvaluationConfig}
# setting -> the part of CoordinatorConfig that holds it
SECTION_OF = {f.name: section for section, cls in SECTIONS.items() for f in fields(cls) if f.init}
DP_FIELDS = [f.name for f in fields(RoundConfig) if f.name.startswith("dp_")]  # "dp_" + a PrivacySettings
