"""The privacy options: secure aggregation's, of `fedspeech coordinator`, and differential privacy's, of
`fedspeech coordinator` and `fedspeech demo`. `--dp-NAME` is the config key `dp_NAME` and the setting
NAME of the privacy wrapper around the strategy, so that `--dp-epsilon 8` is all it takes.
"""

import argparse
from typing import Any


def add_secure_options(parser: argparse.ArgumentParser) -> None:
    """Add --secure-aggregation and its settings (none has a default here: the config's stands)."""
    private = parser.add_argument_group("privacy: what the coordinator may learn of one device's update")
    private.add_argument(
        "--secure-aggregation",
        action="store_true",
        default=None,
        help="the coordinator learns only the sum of each round's updates, never one device's (strategies "
        "that combine updates their own way are refused)",
    )
    private.add_argument(
        "--secure-norm-bound",
        type=float,
        metavar="NORM",
        help="the L2 norm each device's change is bounded to (default 10)",
    )
    private.add_argument(
        "--secure-threshold",
        type=float,
        help="the fraction of a round's devices that must stay to the end (at least 2; default 0.5)",
    )
    private.add_argument(
        "--secure-keys-timeout",
        type=float,
        help="seconds devices have to agree keys, and again to unmask the sum (default 30)",
    )


def add_dp_options(parser: argparse.ArgumentParser) -> None:
    """Add the --dp-* options: any of them wraps the strategy in user-level differential privacy."""
    group = parser.add_argument_group(
        "differential privacy around the strategy (README: Privacy): what the model may tell of a device"
    )
    group.add_argument(
        "--dp-epsilon",
        type=float,
        metavar="EPSILON",
        help="the budget: training stops before a round past it; without --dp-noise-multiplier, the least "
        "noise that keeps all the rounds within it",
    )
    group.add_argument(
        "--dp-delta", type=float, metavar="DELTA", help="the delta epsilon is spent at (default 1e-5)"
    )
    group.add_argument(
        "--dp-norm-bound",
        type=float,
        metavar="NORM",
        help="the L2 norm each device's change is bounded to (default 1)",
    )
    group.add_argument(
        "--dp-noise-multiplier",
        type=float,
        metavar="Z",
        help="the noise's deviation as a multiple of the norm bound (default 1)",
    )
    group.add_argument(
        "--dp-sampling-rate",
        type=float,
        metavar="RATE",
        help="each device's chance of being in a round (default 1)",
    )
    group.add_argument(
        "--dp-norm-bound-quantile",
        type=float,
        metavar="Q",
        help="adapt the bound, from --dp-norm-bound, to the norm this share of changes stay within (0.5: "
        "their median; Andrew et al. 2021), at no cost in epsilon; default: a fixed bound",
    )
    group.add_argument(
        "--dp-norm-bound-learning-rate",
        type=float,
        metavar="RATE",
        help="with --dp-norm-bound-quantile: how far the bound steps each round (default 0.2)",
    )


def dp_options(args: argparse.Namespace) -> dict[str, Any]:
    """The dp_* settings the --dp-* options give, by their config keys; empty when none is given."""
    return {name: value for name, value in vars(args).items() if name.startswith("dp_") and value is not None}
