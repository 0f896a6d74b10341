"""The differential privacy options of `fedspeech coordinator` and `fedspeech demo`: DP-FedAvg's settings
by their own names, so that `--dp-epsilon 8` is all it takes.
"""

import argparse

# option -> the dp_fedavg setting it gives
DP_SETTINGS = {
    "dp_epsilon": "epsilon",
    "dp_delta": "delta",
    "dp_clip": "clip",
    "dp_noise_multiplier": "noise_multiplier",
    "dp_sampling_rate": "sampling_rate",
    "dp_clip_quantile": "target_quantile",
}


def add_dp_options(parser: argparse.ArgumentParser) -> None:
    """Add the --dp-* options: each is a setting of the dp_fedavg strategy, which any of them picks."""
    group = parser.add_argument_group(
        "differential privacy (the dp_fedavg strategy, README: Privacy): what the model may tell of a device"
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
        "--dp-clip",
        type=float,
        metavar="NORM",
        help="the L2 norm each device's change is clipped to (default 1)",
    )
    group.add_argument(
        "--dp-noise-multiplier",
        type=float,
        metavar="Z",
        help="the noise's deviation as a multiple of the clip (default 1)",
    )
    group.add_argument(
        "--dp-sampling-rate",
        type=float,
        metavar="RATE",
        help="each device's chance of being in a round (default 1)",
    )
    group.add_argument(
        "--dp-clip-quantile",
        type=float,
        metavar="Q",
        help="adapt the clip, from --dp-clip, to the norm this share of changes stay within (0.5: their "
        "median; Andrew et al. 2021), at no cost in epsilon; default: a fixed clip",
    )


def dp_options(args: argparse.Namespace) -> dict[str, float]:
    """The dp_fedavg settings the --dp-* options give; empty when none is given."""
    return {
        setting: value
        for option, setting in DP_SETTINGS.items()
        if (value := getattr(args, option)) is not None
    }
