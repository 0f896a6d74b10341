"""A strategy's own settings: a frozen dataclass whose fields carry their bounds, set by name from text.

A strategy declares `Params` with `setting(default, low, high, "what it does")` fields; the operator
sets them as `--strategy-setting name=value` (or in a config file's [strategy]), and `parse` turns those
into the dataclass with one clear line for a name that does not exist or a value out of bounds.
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, TypeVar

P = TypeVar("P", bound="StrategyParams")

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def setting(default: float, low: float, high: float, help: str) -> Any:
    """A Params field with its default, inclusive bounds and a one-line help text."""
    return dataclasses.field(default=default, metadata={"low": low, "high": high, "help": help})


def flag(default: bool, help: str) -> Any:
    """A yes/no Params field with its help text."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class StrategyParams:
    """No settings; the base of every strategy's Params. Bounds are checked on construction."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            low, high = f.metadata.get("low"), f.metadata.get("high")
            if isinstance(value, bool) or low is None or high is None:
                continue
            if not (math.isfinite(value) and low <= value <= high):
                raise ValueError(f"{f.name} must be between {low:g} and {high:g}, got {value}")


def parse(params: type[P], options: Mapping[str, Any]) -> P:
    """The Params from options given as text or numbers; ValueError with one line for a bad one."""
    known = {f.name: f for f in dataclasses.fields(params)}
    values: dict[str, Any] = {}
    for name, raw in options.items():
        if name not in known:
            names = ", ".join(known) or "none"
            raise ValueError(f"unknown setting {name!r} (its settings: {names})")
        values[name] = _value(name, known[name].type, raw)
    return params(**values)


def _value(name: str, kind: Any, raw: Any) -> Any:
    """raw as the field's type (bool, int or float), from text or a number of that kind."""
    text = str(raw).strip().lower()
    if kind in (bool, "bool"):
        if isinstance(raw, bool) or text in _TRUE | _FALSE:
            return raw if isinstance(raw, bool) else text in _TRUE
        raise ValueError(f"{name} takes true or false, got {raw!r}")
    whole = kind in (int, "int")
    try:
        number = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if math.isnan(number) or (whole and not number.is_integer()):
        raise ValueError(f"{name} takes {'a whole number' if whole else 'a number'}, got {raw!r}")
    return int(number) if whole else number


def split_option(text: str) -> tuple[str, str]:
    """'name=value' as (name, value); ValueError for anything else."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise ValueError(f"a strategy setting is name=value, got {text!r}")
    return name.strip(), value.strip()
