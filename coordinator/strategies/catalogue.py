"""Every registered strategy with its settings, their defaults and bounds, read from the declarations
themselves (each strategy's `Params`): what `fedspeech strategies` prints, and the README's table of
settings, which a test holds to it.
"""

import dataclasses
from collections.abc import Iterator

from fedspeech.coordinator.strategies import STRATEGIES, strategy_class
from fedspeech.coordinator.strategies.differential_privacy import DifferentiallyPrivate, PrivacySettings
from fedspeech.coordinator.strategies.params import StrategyParams

PRIVACY = "differential privacy"  # the wrapper's row: its settings are --dp-NAME, config key dp_NAME


def _settings(params: type[StrategyParams], prefix: str = "") -> list[str]:
    """Each setting of a Params as `name=default` (low to high): help; each name after prefix."""
    described = []
    for field in dataclasses.fields(params):
        default: float | bool = field.default  # type: ignore[assignment]  # every setting has one
        help = field.metadata.get("help", "")
        if isinstance(default, bool):
            described.append(f"`{prefix}{field.name}={str(default).lower()}`: {help}")
            continue
        low, high = (_number(field.metadata[bound]) for bound in ("low", "high"))
        described.append(f"`{prefix}{field.name}={_number(default)}` ({low} to {high}): {help}")
    return described


def _number(value: float) -> str:
    """A setting's number as a person writes it: 1000000, 0.01, 1e-05."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _by_params() -> Iterator[tuple[list[str], type[StrategyParams]]]:
    """The registered names that share one Params, in the registry's order, each Params once."""
    groups: dict[type[StrategyParams], list[str]] = {}
    for name in STRATEGIES:
        groups.setdefault(strategy_class(name).Params, []).append(name)
    yield from ((names, params) for params, names in groups.items())


def settings_table() -> str:
    """The markdown table of the strategies that have settings, with their defaults, bounds and help."""
    rows = ["| strategy | settings |", "| --- | --- |"]
    for names, params in _by_params():
        settings = _settings(params)
        if settings:
            rows.append(f"| {', '.join(f'`{name}`' for name in names)} | {'; '.join(settings)} |")
    privacy = "; ".join(_settings(PrivacySettings, "dp_"))
    rows.append(f"| {PRIVACY}, around any strategy that averages every device it is offered | {privacy} |")
    return "\n".join(rows) + "\n"


def listing() -> str:
    """Every strategy, what it does, and its settings (set with --strategy-setting name=value), as text;
    then differential privacy's (set with --dp-NAME value).
    """
    lines = []
    for name in STRATEGIES:
        cls = strategy_class(name)
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        lines.append(f"{name}: {' '.join(doc.split())}")
        lines += [f"    {setting.replace('`', '')}" for setting in _settings(cls.Params)]
    doc = (DifferentiallyPrivate.__doc__ or "").strip()
    lines.append(f"{PRIVACY} (--dp-NAME, around a strategy that averages): {' '.join(doc.split())}")
    lines += [f"    {setting.replace('`', '')}" for setting in _settings(PrivacySettings, "dp_")]
    return "\n".join(lines) + "\n"
