"""Subcommands other distributions add to `fedspeech`: `bench` and `demo` come with fedspeech-bench.

A distribution declares them as entry points in the group COMMANDS; each names a function that adds
its subparser to `fedspeech`'s, importing no more than the parsers need. A known command whose
distribution is not installed still parses, and answers with one line saying how to install it. So does
a command of fedspeech's own run without the extra it needs (EXTRAS: torch for `client`, flask and the
rest for `coordinator`, sounddevice for `record` and the microphone).
"""

import argparse
import importlib.util
from importlib.metadata import entry_points

COMMANDS = "fedspeech.commands"
# the commands of fedspeech-bench, in the order `fedspeech --help` lists them, and what they are
KNOWN = {
    "demo": "one coordinator and one device per FSDD speaker, end to end",
    "bench": "benchmarks",
}
INSTALL = "install the benchmarks from a checkout: pip install -e ./bench"


def add_installed_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add the subparsers of the installed commands' entry points, and a stand-in for each missing one."""
    installed = {point.name: point for point in entry_points(group=COMMANDS)}
    for name in [*KNOWN, *sorted(set(installed) - set(KNOWN))]:
        if name in installed:
            installed[name].load()(subparsers)
        else:
            stand_in = subparsers.add_parser(name, help=f"{KNOWN[name]} (not installed: {INSTALL})")
            stand_in.set_defaults(not_installed=f"fedspeech {name}: {INSTALL}")


def missing_command(args: argparse.Namespace) -> None:
    """SystemExit with one line if the command asked for is a known one that is not installed."""
    message = getattr(args, "not_installed", None)
    if message is not None:
        raise SystemExit(message)


# the modules each extra of fedspeech installs (pyproject.toml's optional-dependencies), by import name
TRAIN = ("torch", "onnx", "onnxscript")
EXTRAS = {
    "train": TRAIN,
    "coordinator": (
        *TRAIN,
        "flask",
        "hypercorn",
        "amqtt",
        "matplotlib",
        "scipy",
        "prometheus_client",
        "dp_accounting",
        "pydantic",
    ),
    "audio": ("sounddevice",),
}
# the extra each of fedspeech's commands needs (listen: for a microphone only)
COMMAND_EXTRAS = {"coordinator": "coordinator", "client": "train", "record": "audio", "listen": "audio"}


def require_extra(command: str) -> None:
    """SystemExit with one line naming the command's extra to install if a module it installs is missing.

    Checked before a command starts anything: the device daemon imports torch only for its first task.
    """
    extra = COMMAND_EXTRAS[command]
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise needs(command, ", ".join(missing), extra)


def needs(command: str, modules: str, extra: str) -> SystemExit:
    """The one line that says a command needs modules, and how to install the extra that has them."""
    install = f'pip install "fedspeech[{extra}]"'
    return SystemExit(f"fedspeech {command}: needs {modules}, which the {extra} extra installs: {install}")


def extra_of(module: str | None, command: str | None = None) -> str | None:
    """The extra to install for a missing module: the command's, if it installs the module, else the
    smallest that does; None for a module no extra installs.
    """
    top = (module or "").split(".")[0]
    own = [COMMAND_EXTRAS[command]] if command in COMMAND_EXTRAS else []
    return next((extra for extra in [*own, "audio", "train", "coordinator"] if top in EXTRAS[extra]), None)
