"""The coordinator's typed settings: bounds, and the file, variables and options they are read from."""

import argparse
import dataclasses
from pathlib import Path

import pytest

from fedspeech.coordinator.config import SECTION_OF, SECTIONS, CoordinatorConfig, RoundConfig, ServiceConfig
from fedspeech.coordinator.config_sources import (
    ConfigError,
    args_layer,
    combine,
    env_layer,
    file_layer,
    from_args,
    from_env,
    from_file,
    where,
)
from fedspeech.coordinator.strategies.differential_privacy import PrivacySettings
from fedspeech.coordinator.strategies.fedprox import FedProx
from fedspeech.coordinator.strategies.trimmed_mean import FedTrimmedMean

FILE = """
[service]
state = "fleet-state"
task = "emodb"
open_enrolment = true

[rounds]
rounds = 30
round_timeout = 300   # a whole number where a float is expected is fine
min_devices = 4

[evaluation]
eval_corpus = "emodb"
eval_limit = 200

[strategy]
name = "fedprox"
mu = 0.1
"""


def _file(tmp_path: Path, text: str = FILE) -> Path:
    path = tmp_path / "coordinator.toml"
    path.write_text(text)
    return path


def _args(**options) -> argparse.Namespace:
    """A namespace like the parser's: every option None unless given."""
    return argparse.Namespace(**options)


def _parsed(*options: str) -> argparse.Namespace:
    from fedspeech.__main__ import build_parser

    return build_parser().parse_args(["coordinator", *options])


def test_a_setting_has_one_name_across_the_parts():
    given = [f for cls in SECTIONS.values() for f in dataclasses.fields(cls) if f.init]
    assert len(SECTION_OF) == len(given)


def test_a_file_sets_each_part_and_the_strategy(tmp_path):
    config = from_file(_file(tmp_path))
    assert config.service.state == Path("fleet-state") and config.service.task == "emodb"
    assert config.service.open_enrolment is True
    assert (config.rounds.rounds, config.rounds.min_devices) == (30, 4)
    assert config.rounds.round_timeout == 300.0 and isinstance(config.rounds.round_timeout, float)
    assert config.rounds.strategy == "fedprox" and config.rounds.strategy_settings == FedProx.Params(mu=0.1)
    assert (config.evaluation.eval_corpus, config.evaluation.eval_limit) == ("emodb", 200)
    assert config.rounds.epochs == RoundConfig().epochs, "what the file leaves out keeps its default"


def test_options_override_variables_which_override_the_file(tmp_path):
    environ = {"FEDSPEECH_ROUNDS": "5", "FEDSPEECH_MIN_DEVICES": "3", "FEDSPEECH_PI_TEST": "1"}
    args = _args(config=_file(tmp_path), rounds=7, eval_limit=None)
    config = from_args(args, environ)
    assert config.rounds.rounds == 7, "an option given wins"
    assert config.rounds.min_devices == 3, "a variable wins over the file"
    assert config.evaluation.eval_limit == 200, "an option left at None does not clobber the file"
    assert config.service.task == "emodb"


def test_variables_are_read_as_their_settings_types():
    environ = {
        "FEDSPEECH_OPEN_ENROLMENT": "yes",
        "FEDSPEECH_LR": "0.01",
        "FEDSPEECH_STATE": "/var/lib/fedspeech",
        "FEDSPEECH_BROKER": "",
        "FEDSPEECH_STRATEGY": "trimmed_mean",
        "FEDSPEECH_STRATEGY_SETTINGS": "trim=0.2",
        "FEDSPEECH_NORM_BOUND": "5",
    }
    config = from_env(environ)
    assert config.service.open_enrolment is True and config.rounds.lr == 0.01
    assert config.service.state == Path("/var/lib/fedspeech") and config.service.broker is None
    assert config.rounds.strategy_settings == FedTrimmedMean.Params(trim=0.2)
    assert config.rounds.norm_bound == 5.0, "a number where a number is meant, made once"


def test_strategy_settings_add_up_while_the_strategy_stays_and_go_when_it_changes(tmp_path):
    layers = [file_layer(_file(tmp_path))]
    same = combine(*layers, args_layer(_args(strategy_settings=["mu=0.3"])))
    assert same.rounds.strategy == "fedprox" and same.rounds.strategy_settings == FedProx.Params(mu=0.3)
    other = combine(*layers, args_layer(_args(strategy="trimmed_mean")))
    assert other.rounds.strategy == "trimmed_mean" and other.rounds.strategy_settings is None


def test_a_strategy_setting_out_of_bounds_is_refused_naming_where_it_was_given(tmp_path):
    layers = [file_layer(_file(tmp_path)), args_layer(_args(strategy_settings=["mu=-1"]))]
    with pytest.raises(ConfigError, match="^--strategy-setting: strategy fedprox: mu must be between"):
        combine(*layers)


def test_a_norm_bound_is_made_a_number_or_a_word_where_it_enters(tmp_path):
    assert combine(args_layer(_args(norm_bound="2.5"))).rounds.norm_bound == 2.5
    assert combine(args_layer(_args(norm_bound="off"))).rounds.norm_bound == "off"
    assert from_file(_file(tmp_path, "[rounds]\nnorm_bound = 3\n")).rounds.norm_bound == 3.0
    with pytest.raises(ConfigError, match="^--norm-bound: norm_bound must be median, off or a positive"):
        args_layer(_args(norm_bound="-1"))
    with pytest.raises(ValueError, match="norm_bound must be"):
        RoundConfig(norm_bound="5.0")  # type: ignore[arg-type]  # text past the edge is refused


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[rounds]\nroundz = 3\n", ["[rounds] roundz", "did you mean rounds?"]),
        ("[rounds]\ntask = 'fsdd'\n", ["[rounds] task", "belongs in [service]"]),
        ("[rounds]\nstrategy = 'fedprox'\n", ["[rounds] strategy", "goes in [strategy]"]),
        ("[round]\nrounds = 3\n", ["no section [round]"]),
        ("rounds = 3\n", ["rounds is outside any section"]),
        ("[rounds]\nrounds = 'ten'\n", ["[rounds] rounds", "expected a whole number, got 'ten'"]),
        ("[service]\nopen_enrolment = 1\n", ["[service] open_enrolment", "expected true or false"]),
        ("[rounds]\nrounds = \n", ["is not a TOML file", "line 2"]),
        ("[rounds]\nepochs = 0\n", ["epochs must be between 1 and"]),
        ("[service]\nhttp_threads = 0\n", ["http_threads must be at least 1, got 0"]),
        ("[strategy]\nname = 'fedprox'\nmu = -1\n", ["strategy fedprox", "mu must be between 0 and 100"]),
        ("[strategy]\nname = 'trimmed_mean'\nmu = 1\n", ["strategy trimmed_mean", "unknown setting 'mu'"]),
        ("[strategy]\nname = 'fedbest'\n", ["'fedbest'"]),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, says):
    path = _file(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        from_file(path)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(str(path)), line
    for text in says:
        assert text in line, line


def test_a_missing_file_says_it_cannot_be_read(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file .*nothing.toml"):
        from_file(tmp_path / "nothing.toml")


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"FEDSPEECH_ROUNDS": "ten"}, "FEDSPEECH_ROUNDS: expected a whole number, got 'ten'"),
        ({"FEDSPEECH_OPEN_ENROLMENT": "maybe"}, "FEDSPEECH_OPEN_ENROLMENT: expected true or false"),
        ({"FEDSPEECH_EPOCHS": "0"}, "FEDSPEECH_EPOCHS: epochs must be between 1 and"),
        ({"FEDSPEECH_K": "0"}, "FEDSPEECH_K: k must be at least 1, got 0"),
        (
            {"FEDSPEECH_ROUNDS": "5", "FEDSPEECH_MIN_RESULTS": "0"},
            "FEDSPEECH_ROUNDS, FEDSPEECH_MIN_RESULTS: min_results must be at least 1",
        ),
        (
            {"FEDSPEECH_STRATEGY_SETTINGS": "mu"},
            "FEDSPEECH_STRATEGY_SETTINGS: a strategy setting is name=value",
        ),
    ],
)
def test_a_bad_variable_is_named(environ, says):
    with pytest.raises(ConfigError, match=f"^{says}"):
        from_env(environ)


def test_a_strategy_option_given_twice_is_refused():
    with pytest.raises(ConfigError, match="--strategy-setting mu given twice"):
        args_layer(_args(strategy="fedprox", strategy_settings=["mu=0.1", "mu=0.2"]))


def test_where_names_the_source_that_gave_a_setting_last(tmp_path):
    layers = [file_layer(_file(tmp_path)), env_layer({"FEDSPEECH_TASK": "fsdd"}), args_layer(_args(port=0))]
    assert where("task", layers) == "FEDSPEECH_TASK"
    assert where("eval_limit", layers) == f"{tmp_path / 'coordinator.toml'} [evaluation] eval_limit"
    assert where("port", layers) == "--port"


def test_changed_checks_the_new_values_together():
    config = CoordinatorConfig()
    both = config.changed(tls_cert=Path("cert.pem"), tls_key=Path("key.pem"), rounds=3)
    assert both.service.tls_key == Path("key.pem") and both.rounds.rounds == 3
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        config.changed(tls_cert=Path("cert.pem"))
    with pytest.raises(ValueError, match="no setting 'round'"):
        config.changed(round=3)
    moved = config.changed(eval_corpus="fsdd").changed(eval_data=Path("clips"), eval_corpus=None)
    assert moved.evaluation.eval_data == Path("clips") and moved.evaluation.eval_corpus is None


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ({"port": 70000}, "port must be a port number"),
        ({"http_timeout": float("nan")}, "http_timeout must be a positive number"),
        ({"http_timeout": 7200.0}, "http_timeout must be a positive number of seconds, at most 3600"),
        ({"http_threads": 1000}, "http_threads must be at most 256"),
        ({"http_connections_per_client": 0}, "http_connections_per_client must be at least 1"),
        ({"http_body_budget": 1024}, "http_body_budget must be at least 67108864"),
        ({"model": "resnet"}, "model must be one of"),
        ({"shared_validation": -1}, "shared_validation must be at least 0"),
    ],
)
def test_service_settings_out_of_bounds_are_refused(setting, says):
    with pytest.raises(ValueError, match=says):
        ServiceConfig(**setting)


@pytest.mark.parametrize("setting", ["rounds", "min_devices", "min_results", "k", "eval_min_reports"])
def test_round_counts_below_one_are_refused_as_the_options_are(setting):
    with pytest.raises(ValueError, match=f"^{setting} must be at least 1, got 0$"):
        RoundConfig(**{setting: 0})
    assert getattr(RoundConfig(**{setting: 1}), setting) == 1


def test_the_command_lines_options_given_win_and_those_left_out_keep_the_file(tmp_path):
    args = _parsed(
        "--config", str(_file(tmp_path)), "--rounds", "7", "--lr", "0.01", "--strategy-setting", "mu=1"
    )
    config = from_args(args, environ={})
    assert (config.rounds.rounds, config.rounds.lr) == (7, 0.01)
    assert config.rounds.strategy_settings == FedProx.Params(mu=1.0)
    # left out: the file's, never the option's own default
    assert config.service.state == Path("fleet-state") and config.service.open_enrolment is True
    assert config.rounds.min_devices == 4 and config.evaluation.eval_corpus == "emodb"
    plain = from_args(_parsed(), environ={})
    assert plain == CoordinatorConfig(), "no option, no file, no variable: the defaults"


def test_every_option_names_a_setting():
    args = vars(_parsed())
    # each option's dest is the name of its setting: the config key, and FEDSPEECH_ + it in upper case
    assert set(args) - set(SECTION_OF) == {"command", "config", "run", "verbose"}
    # and the option is that name with hyphens; the strategy's own settings are given one at a time
    from fedspeech.__main__ import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for action in commands.choices["coordinator"]._actions:
        if action.dest in SECTION_OF:
            name = "strategy_setting" if action.dest == "strategy_settings" else action.dest
            assert "--" + name.replace("_", "-") in action.option_strings, action.option_strings
    # each of differential privacy's settings is an option --dp-NAME and a config key dp_NAME
    privacy = {f"dp_{f.name}" for f in dataclasses.fields(PrivacySettings)}
    assert privacy <= set(args) and privacy <= set(SECTION_OF)


def test_the_readmes_config_file_is_read_as_it_says(tmp_path):
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    example = readme.split("## Configuration", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    config = from_file(_file(tmp_path, example))
    assert config.service.host == "0.0.0.0" and config.rounds.round_timeout == 300.0
    assert config.rounds.strategy == "fedprox" and config.rounds.strategy_settings == FedProx.Params(mu=0.1)
    assert config.evaluation.eval_data == Path("/var/lib/fedspeech/heldout")
