"""The options that bound what one device's update may do to the global model, shared by `fedspeech
coordinator`, `fedspeech demo` and `fedspeech bench strategies`: `--NAME` is the config key NAME, and an
option left out leaves the setting as it was.
"""

import argparse
from typing import Any

DEFENCE_SETTINGS = ("norm_bound", "norm_bound_factor", "direction_check")


def add_defence_options(parser: argparse.ArgumentParser) -> None:
    """Add --norm-bound, --norm-bound-factor and --[no-]direction-check."""
    group = parser.add_argument_group("what one device's update may do to the global model")
    group.add_argument(
        "--norm-bound",
        metavar="median|off|NORM",
        help="bound on each update's change (L2) before aggregation: a multiple of the round's median "
        "(default), a fixed norm, or off",
    )
    group.add_argument(
        "--norm-bound-factor",
        type=float,
        help="with --norm-bound median: the bound as a multiple of the round's median change (default 2)",
    )
    group.add_argument(
        "--direction-check",
        action=argparse.BooleanOptionalAction,
        help="leave out an update whose change points away from the mean of the round's others (default on)",
    )


def defence_options(args: argparse.Namespace) -> dict[str, Any]:
    """The settings those options give, by their config keys, norm_bound read ("median", "off" or a
    number); empty when none is given; ValueError for a bad bound.
    """
    from fedspeech.coordinator.config import norm_bound_value  # here: the device commands never load it

    given = {name: getattr(args, name) for name in DEFENCE_SETTINGS if getattr(args, name) is not None}
    if "norm_bound" in given:
        given["norm_bound"] = norm_bound_value(given["norm_bound"])
    return given
