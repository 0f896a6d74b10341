"""Where the coordinator's settings come from: defaults < a config file < FEDSPEECH_* variables < options.

A config file is TOML with sections [service], [rounds] and [evaluation], each holding settings of that
part of CoordinatorConfig by field name, and [strategy]: the strategy's `name` and its own settings. An
environment variable is FEDSPEECH_ and a setting's name in upper case (FEDSPEECH_ROUNDS=5); the
strategy's own settings are FEDSPEECH_STRATEGY_SETTINGS=name=value,name=value. An option of `fedspeech
coordinator` is the setting's name with hyphens (--min-devices 3); the strategy's own settings are
--strategy-setting name=value, repeated. Each source is read into a Layer and laid over the ones below
it; a setting that cannot be used is a ConfigError, one line naming the setting and its source. Every
value is made its setting's type here, once: what the round loop and the strategies receive are those
values, never text.
"""

import argparse
import difflib
import os
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from fedspeech.coordinator.config import SECTION_OF, SECTIONS, CoordinatorConfig, norm_bound_value
from fedspeech.coordinator.strategies import strategy_params
from fedspeech.coordinator.strategies.params import split_option

ENV_PREFIX = "FEDSPEECH_"
_OPTIONS = "strategy_settings"  # the strategy's own settings: name=value texts, or a file's [strategy]
# settings whose type is more than one: each made from a file's value or a text by its own function
_PARSED = {"norm_bound": norm_bound_value}
_WORDS = {int: "a whole number", float: "a number", bool: "true or false", str: "text", Path: "a path"}


class ConfigError(ValueError):
    """A setting that cannot be used, in one line that names it and where it was given."""


@dataclass(frozen=True)
class Layer:
    """The settings one source gives, by name, and how that source spells each of them."""

    source: str  # what a refusal is prefixed with: the file, the variables; "" for options, named in it
    values: Mapping[str, Any]
    names: Mapping[str, str]  # setting -> "FILE [rounds] rounds", "FEDSPEECH_ROUNDS", "--rounds"


def _kinds() -> dict[str, tuple[type, bool]]:
    """Each setting's type (a Literal as str) and whether it may be None; strategy_settings aside."""
    kinds = {}
    for cls in SECTIONS.values():
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if not f.init or f.name in _PARSED:
                continue
            hint, optional = hints[f.name], False
            if isinstance(hint, types.UnionType):
                optional = type(None) in typing.get_args(hint)
                hint = next(a for a in typing.get_args(hint) if a is not type(None))
            if typing.get_origin(hint) is typing.Literal:
                hint = str
            if f.name != _OPTIONS:
                kinds[f.name] = (hint, optional)
    return kinds


_KINDS = _kinds()


def _checked(value: Any, name: str, label: str) -> Any:
    """A typed value (a file's, an option's) as the setting's type; ConfigError if it is another."""
    if name in _PARSED:
        return _parsed(value, name, label)
    kind, _ = _KINDS[name]
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is float and number:
        return float(value)
    if kind is Path and isinstance(value, str | Path) and str(value):
        return Path(value)
    if kind in (int, bool, str) and type(value) is kind:
        return value
    raise ConfigError(f"{label}: expected {_WORDS[kind]}, got {value!r}")


def _from_text(text: str, name: str, label: str) -> Any:
    """An environment variable's text as the setting's type (empty: None, where None is allowed)."""
    if name in _PARSED:
        return _parsed(text, name, label)
    kind, optional = _KINDS[name]
    if optional and not text:
        return None
    if kind is bool and text.lower() in _BOOLS:
        return _BOOLS[text.lower()]
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    elif kind is str or (kind is Path and text):
        return kind(text)
    raise ConfigError(f"{label}: expected {_WORDS[kind]}, got {text!r}")


def _parsed(value: Any, name: str, label: str) -> Any:
    """value made by its setting's own function; ConfigError naming where it was given if it cannot be."""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ConfigError(f"{label}: expected text or a number, got {value!r}")
    try:
        return _PARSED[name](value)
    except ValueError as exc:
        raise ConfigError(f"{label}: {exc}") from None


_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _options(texts: Iterable[str], label: str) -> dict[str, str]:
    """name=value texts, each name once, as a mapping."""
    options: dict[str, str] = {}
    for text in texts:
        try:
            name, value = split_option(text)
        except ValueError as exc:
            raise ConfigError(f"{label}: {exc}") from None
        if name in options:
            raise ConfigError(f"{label} {name} given twice")
        options[name] = value
    return options


def file_layer(path: Path) -> Layer:
    """A config file's settings; ConfigError for a file that cannot be read, an unknown key, a bad type."""
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not a TOML file: {exc}") from None
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {section} is outside any section: {_SECTIONS_TEXT}")
        if section not in (*SECTIONS, "strategy"):
            raise ConfigError(f"{path}: no section [{section}]: {_SECTIONS_TEXT}")
        for key, value in table.items():
            label = f"{path} [{section}] {key}"
            if section == "strategy":
                names[_strategy_entry(key, value, label, values)] = label
            elif SECTION_OF.get(key) == section and key not in ("strategy", _OPTIONS):
                values[key], names[key] = _checked(value, key, label), label
            else:
                raise ConfigError(f"{label}: {_unknown(key, section)}")
    return Layer(str(path), values, names)


_SECTIONS_TEXT = "settings go under [service], [rounds], [evaluation] or [strategy]"


def _strategy_entry(key: str, value: Any, label: str, values: dict[str, Any]) -> str:
    """Put a key of a file's [strategy] in values (its name, or one of its own settings); the setting set."""
    if key == "name":
        if not isinstance(value, str):
            raise ConfigError(f"{label}: expected a strategy's name, got {value!r}")
        values["strategy"] = value
        return "strategy"
    if not isinstance(value, str | int | float):  # bool is an int
        raise ConfigError(f"{label}: expected text, a number, or true or false, got {value!r}")
    values.setdefault(_OPTIONS, {})[key] = value
    return _OPTIONS


def _unknown(key: str, section: str) -> str:
    """Why a file's key is not a setting of its section, and where it may belong."""
    if key in ("strategy", _OPTIONS):
        return "the strategy goes in [strategy]: its name = ..., then its own settings"
    if key in SECTION_OF:
        return f"not a setting of [{section}]: it belongs in [{SECTION_OF[key]}]"
    known = [f.name for f in fields(SECTIONS[section])]
    close = difflib.get_close_matches(key, known, 1)
    return "no such setting" + (f" (did you mean {close[0]}?)" if close else "")


def env_layer(environ: Mapping[str, str]) -> Layer:
    """The settings FEDSPEECH_* variables give; variables with other names are left alone."""
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for name in SECTION_OF:
        variable = ENV_PREFIX + name.upper()
        if variable not in environ:
            continue
        text = environ[variable]
        if name == _OPTIONS:
            values[name] = _options([t for t in text.split(",") if t.strip()], variable)
        else:
            values[name] = _from_text(text.strip(), name, variable)
        names[name] = variable
    return Layer(", ".join(names.values()), values, names)


def args_layer(args: argparse.Namespace) -> Layer:
    """The settings `fedspeech coordinator`'s options give: those left at None are not given."""
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for name in SECTION_OF:
        value = getattr(args, name, None)  # each option's dest is its setting's name
        if value is None:
            continue
        label = "--strategy-setting" if name == _OPTIONS else "--" + name.replace("_", "-")
        values[name] = _options(value, label) if name == _OPTIONS else _checked(value, name, label)
        names[name] = label
    return Layer("", values, names)


def combine(*layers: Layer, base: CoordinatorConfig | None = None) -> CoordinatorConfig:
    """The config of base (default: the defaults) with each layer over the one before.

    A layer's settings of the strategy add to those below while it keeps the strategy, and replace them
    when it names another; they are made the strategy's Params once, over all the layers. ConfigError,
    prefixed with the layer's source, for a value out of bounds.
    """
    config = base or CoordinatorConfig()
    given = config.rounds.strategy_settings
    options: dict[str, Any] = asdict(given) if given is not None else {}
    for layer in layers:
        values = dict(layer.values)
        if values.get("strategy", config.rounds.strategy) != config.rounds.strategy:
            options = {}
        options.update(values.pop(_OPTIONS, {}))
        try:
            config = config.changed(**values)
        except ValueError as exc:
            raise ConfigError(f"{layer.source}: {exc}" if layer.source else str(exc)) from None
    if not options:
        return config
    try:
        settings = strategy_params(config.rounds.strategy, options)
    except ValueError as exc:
        raise ConfigError(f"{where(_OPTIONS, layers)}: {exc}") from None
    return config.changed(strategy_settings=settings)


def where(name: str, layers: Iterable[Layer]) -> str:
    """How the last layer that gives a setting spells it (an option, a variable, a file's key)."""
    spelt = [layer.names[name] for layer in layers if name in layer.names]
    return spelt[-1] if spelt else name


def source_layers(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> list[Layer]:
    """The layers of `fedspeech coordinator`: its --config file (if any), FEDSPEECH_* variables, options."""
    config_file = getattr(args, "config", None)
    files = [file_layer(Path(config_file))] if config_file is not None else []
    return [*files, env_layer(os.environ if environ is None else environ), args_layer(args)]


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> CoordinatorConfig:
    """The config of `fedspeech coordinator`: defaults < its --config file < FEDSPEECH_* < its options."""
    return combine(*source_layers(args, environ))


def from_file(path: Path) -> CoordinatorConfig:
    """The config of a file over the defaults."""
    return combine(file_layer(path))


def from_env(environ: Mapping[str, str] | None = None) -> CoordinatorConfig:
    """The config of FEDSPEECH_* variables over the defaults."""
    return combine(env_layer(os.environ if environ is None else environ))
