"""Subcommands other distributions add to `fedspeech`: `bench` and `demo` come with fedspeech-bench.

A distribution declares them as entry points in the group COMMANDS; each names a function that adds
its subparser to `fedspeech`'s, importing no more than the parsers need. A known command whose
distribution is not installed still parses, and answers with one line saying how to install it.
"""

import argparse
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
