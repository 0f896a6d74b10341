"""`fedspeech bench privacy`: what secure aggregation costs, against plain FedAvg, for fleets of n devices;
what it and differential privacy hide from a coordinator that tries to infer each device's labels
(label_attack); and what differential privacy costs in accuracy at each epsilon (dp_curve).

One round of the secure sum runs in this process, through the device's and the coordinator's own phase
code (edge_client.secure_sum_device, coordinator.privacy.secure_sum_server), with no transport: every device
advertises, shares, masks and unmasks, none drops out, and the threshold is a majority (n // 2 + 1). For
each n it reports a device's CPU time in each phase (the mean over the devices), the coordinator's time
to take the round in and unmask it, and the bytes one device sends and receives, from the phases'
messages as they are (keys, sealed shares, the masked vector, the shares given up; the wire's encoding
and headers not counted). Plain FedAvg's device sends its update as float32 and receives the model, and
its coordinator sums n float32 vectors.
"""

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fedspeech_bench.dp_curve import DELTA, EPSILONS, TARGETS

DEMO_LENGTH = 82459  # weights of the demo's model (cnn, FSDD's 11 classes)
DEFAULT_DEVICES = (6, 20, 100)


@dataclass(frozen=True)
class Costs:
    """One fleet size's costs of a secure-sum round, and plain FedAvg's for the same fleet."""

    devices: int
    threshold: int
    device_ms: dict[str, float]  # phase -> mean CPU ms per device
    coordinator_ms: float
    plain_coordinator_ms: float
    sent_bytes: int  # by one device
    received_bytes: int
    plain_sent_bytes: int
    plain_received_bytes: int


def measure(devices: int, length: int, seed: int = 0) -> Costs:
    """Run one secure-sum round of `devices` in process and time it; check its sum is exact."""
    import numpy as np
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedspeech.coordinator.privacy.secure_sum_server import ServerRound
    from fedspeech.edge_client.secure_sum_device import DeviceRound
    from fedspeech.protocol.secure_sum_maths import FixedPoint

    rng = np.random.default_rng(seed)
    ids = [f"device-{n:03d}" for n in range(devices)]
    threshold = devices // 2 + 1
    identities = {d: Ed25519PrivateKey.generate() for d in ids}
    public = {d: key.public_key() for d, key in identities.items()}
    coding = FixedPoint(clip=1.0, devices=devices)
    updates = {d: coding.encode(rng.normal(0, 0.01, length)) for d in ids}
    server = ServerRound(1, threshold, length, public)
    device_s = dict.fromkeys(("advert", "share", "mask", "unmask"), 0.0)
    server_s = 0.0
    clock = time.process_time

    rounds, adverts = {}, []
    for d in ids:
        start = clock()
        rounds[d] = DeviceRound(d, 1, threshold, identities[d])
        adverts.append(rounds[d].advert())
        device_s["advert"] += clock() - start
    start = clock()
    for advert in adverts:
        server.take_advert(advert)
    handed = server.adverts()
    server_s += clock() - start

    shares_sent = 0
    for d in ids:
        start = clock()
        shares = rounds[d].share(handed, public)
        device_s["share"] += clock() - start
        shares_sent = sum(len(s) for s in shares.sealed.values())
        start = clock()
        server.take_shares(shares)
        server_s += clock() - start
    sharers = server.sharers()

    for d in ids:
        start = clock()
        masked = rounds[d].masked(updates[d], sharers)
        device_s["mask"] += clock() - start
        start = clock()
        server.take_masked(d, masked)
        server_s += clock() - start
    survivors = server.survivors()

    given_up = 0
    for d in ids:
        received = server.shares_for(d)
        start = clock()
        reply = rounds[d].unmask(survivors, received)
        device_s["unmask"] += clock() - start
        given_up = sum(len(s) for s in [*reply.seed_shares.values(), *reply.key_shares.values()])
        start = clock()
        server.take_unmasking(reply)
        server_s += clock() - start
    start = clock()
    total, _, _ = server.total()
    server_s += clock() - start

    expected = np.zeros(length, np.uint32)
    for update in updates.values():
        expected += update
    if not np.array_equal(total, expected):
        raise RuntimeError(f"the secure sum of {devices} devices is not their sum")
    floats = [rng.normal(0, 0.01, length).astype(np.float32) for _ in ids]
    start = clock()
    np.sum(floats, axis=0)
    plain = clock() - start
    advert_bytes = 3 * 32 + 64
    return Costs(
        devices=devices,
        threshold=threshold,
        device_ms={name: 1000 * spent / devices for name, spent in device_s.items()},
        coordinator_ms=1000 * server_s,
        plain_coordinator_ms=1000 * plain,
        sent_bytes=advert_bytes + shares_sent + 4 * length + given_up,
        # every advert, the shares sealed for it, and the model (float32) it trains
        received_bytes=devices * advert_bytes + shares_sent + 4 * length,
        plain_sent_bytes=4 * length,
        plain_received_bytes=4 * length,
    )


def table(results: list[Costs], length: int) -> str:
    """The costs as a markdown table."""
    lines = [
        f"secure sum of {length} weights, one round, in process; plain FedAvg for the same fleet",
        "",
        "| devices | threshold | device CPU ms (advert / share / mask / unmask) | device ms in all "
        "| coordinator ms (plain) | device sends KB (plain) | device receives KB (plain) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        phases = " / ".join(f"{ms:.2f}" for ms in r.device_ms.values())
        lines.append(
            f"| {r.devices} | {r.threshold} | {phases} | {sum(r.device_ms.values()):.1f} "
            f"| {r.coordinator_ms:.1f} ({r.plain_coordinator_ms:.2f}) "
            f"| {r.sent_bytes / 1024:.1f} ({r.plain_sent_bytes / 1024:.1f}) "
            f"| {r.received_bytes / 1024:.1f} ({r.plain_received_bytes / 1024:.1f}) |"
        )
    return "\n".join(lines)


def plot(results: list[Costs], out: Path) -> Path:
    """Device and coordinator time, and bytes sent, against the fleet's size."""
    from fedspeech_bench.report.plots import pyplot

    plt = pyplot()

    n = [r.devices for r in results]
    fig, (time_axes, bytes_axes) = plt.subplots(1, 2, figsize=(10, 4))
    time_axes.plot(n, [sum(r.device_ms.values()) for r in results], "o-", label="a device, secure sum")
    time_axes.plot(n, [r.coordinator_ms for r in results], "s-", label="coordinator, secure sum")
    time_axes.plot(n, [r.plain_coordinator_ms for r in results], "s--", label="coordinator, plain FedAvg")
    time_axes.set(xlabel="devices in the round", ylabel="CPU ms per round", xscale="log", yscale="log")
    time_axes.legend()
    bytes_axes.plot(n, [r.sent_bytes / 1024 for r in results], "o-", label="a device sends, secure sum")
    bytes_axes.plot(n, [r.plain_sent_bytes / 1024 for r in results], "o--", label="a device sends, plain")
    bytes_axes.set(xlabel="devices in the round", ylabel="KB per round", xscale="log", ylim=(0, None))
    bytes_axes.legend()
    fig.tight_layout()
    path = out / "secure-sum-costs.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@dataclass(frozen=True)
class CurveOptions:
    """The accuracy-epsilon curve's arms and fleet: where Speech Commands is (None: no curve)."""

    data_dir: Path | None = None
    epsilons: tuple[float, ...] = EPSILONS
    rounds: int = 30
    sampling_rate: float = 0.2
    norm_bound: float = 1.0
    norm_bound_quantile: float = 0.0  # with it, each epsilon also has an arm whose bound adapts to it


def run_privacy_bench(
    out: Path, devices: list[int], length: int, attack_devices: int = 20, curve: CurveOptions = CurveOptions()
) -> Path:
    """Measure each fleet size, run the label-inference attack (also under differential privacy at each
    of the curve's epsilons) and the accuracy-epsilon curve, then write results.md, results.json and the
    plots into out.
    """
    from fedspeech.coordinator.privacy.budget import noise_multiplier_for
    from fedspeech_bench.dp_curve import curve_plot, curve_table, fleet_sizes, run_curve, sizes_table
    from fedspeech_bench.label_attack import MISSING, attack_plot, attack_table, run_attack

    out.mkdir(parents=True, exist_ok=True)
    results = []
    for n in devices:
        results.append(measure(n, length))
        print(f"{n} devices: measured", flush=True)
    text = table(results, length)
    print(text)
    picture = plot(results, out)
    view = "DP-FedAvg at epsilon {:g}: one device's bounded change with the round's noise"
    noise = {
        view.format(e): noise_multiplier_for(e, DELTA, curve.sampling_rate, curve.rounds)
        for e in curve.epsilons
    }
    scores = run_attack(attack_devices, noise=noise, norm_bound=curve.norm_bound)
    attack = attack_table(scores, MISSING)
    print(attack)
    bars = attack_plot(scores, out)
    parts = [f"# bench privacy\n\n{text}\n\n![costs]({picture.name})\n\n"]
    parts.append(f"{attack}\n\n![attack]({bars.name})\n")
    report: dict = {"costs": [asdict(r) for r in results], "attack": [asdict(s) for s in scores]}
    if curve.data_dir is None:
        print("no accuracy-epsilon curve: it needs Speech Commands (--data-dir DIR: speech_commands_test/)")
    else:
        setting, points = run_curve(
            curve.data_dir, curve.epsilons, curve.sampling_rate, curve.rounds, curve.norm_bound,
            norm_bound_quantile=curve.norm_bound_quantile,
        )  # fmt: skip
        rows = fleet_sizes(setting, points)
        accuracy, sizes = curve_table(setting, points), sizes_table(setting, rows)
        print(f"{accuracy}\n\n{sizes}")
        figure = curve_plot(setting, points, out)
        parts.append(f"\n{accuracy}\n\n![accuracy against epsilon]({figure.name})\n\n{sizes}\n")
        report["curve"] = {"setting": asdict(setting), "points": [asdict(p) for p in points]}
        report["fleet_sizes"] = {"epsilons": TARGETS, "needs": [needs for _, needs in rows]}
    (out / "results.md").write_text("".join(parts))
    (out / "results.json").write_text(json.dumps(report, indent=1))
    return out / "results.md"


def _epsilons(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("epsilons are comma-separated numbers") from None
    if not values or any(not 0.01 <= e <= 1000 for e in values):
        raise argparse.ArgumentTypeError("epsilons are comma-separated, each from 0.01 to 1000")
    return values


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",")]
    if not sizes or any(not 3 <= n <= 255 for n in sizes):
        raise argparse.ArgumentTypeError("fleet sizes are comma-separated, each from 3 to 255")
    return sizes


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `bench privacy` and its options to the `bench` subcommands."""
    p = bench_subparsers.add_parser(
        "privacy", help="what secure aggregation costs, the label-inference attack, accuracy against epsilon"
    )
    default = ",".join(str(n) for n in DEFAULT_DEVICES)
    p.add_argument("--devices", type=_sizes, default=list(DEFAULT_DEVICES), help=f"(default {default})")
    p.add_argument(
        "--length",
        type=int,
        default=DEMO_LENGTH,
        help=f"weights per update (default {DEMO_LENGTH}: the demo's)",
    )
    p.add_argument(
        "--attack-devices",
        type=int,
        default=20,
        help="devices of the label-skewed FSDD fleet the label-inference attack runs on (default 20)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        help="folder holding speech_commands_test/, for the accuracy-epsilon curve (without it: no curve)",
    )
    p.add_argument(
        "--epsilons",
        type=_epsilons,
        default=EPSILONS,
        help=f"the curve's arms (default {','.join(f'{e:g}' for e in EPSILONS)})",
    )
    p.add_argument("--rounds", type=int, default=30, help="rounds of each arm of the curve (default 30)")
    p.add_argument(
        "--sampling-rate", type=float, default=0.2, help="each device's chance of a round (default 0.2)"
    )
    p.add_argument(
        "--dp-norm-bound", type=float, default=1.0, help="each change bounded to this norm (default 1)"
    )
    p.add_argument(
        "--dp-norm-bound-quantile",
        type=float,
        default=0.0,
        help="also run each epsilon with the bound adapting to this quantile of the changes' norms, from "
        "--dp-norm-bound (default: no such arms)",
    )
    p.add_argument("--out", type=Path, default=Path("fedspeech-bench-privacy"), help="where results go")
    p.set_defaults(run=run_from_args)


def run_from_args(args: argparse.Namespace) -> None:
    """`fedspeech bench privacy`: check the options, then run."""
    if not 1 <= args.length <= 100_000_000:
        raise SystemExit(f"fedspeech bench privacy: --length must be from 1 to 100000000, not {args.length}")
    if not 2 <= args.attack_devices <= 1000:
        raise SystemExit(
            f"fedspeech bench privacy: --attack-devices must be from 2 to 1000, not {args.attack_devices}"
        )
    if (
        not 1 <= args.rounds <= 10_000
        or not 0 < args.sampling_rate <= 1
        or not 0 < args.dp_norm_bound <= 1000
        or not 0 <= args.dp_norm_bound_quantile <= 1
    ):
        raise SystemExit(
            "fedspeech bench privacy: --rounds from 1 to 10000, --sampling-rate in (0, 1], --dp-norm-bound "
            "in (0, 1000], --dp-norm-bound-quantile in [0, 1]"
        )
    curve = CurveOptions(
        args.data_dir,
        args.epsilons,
        args.rounds,
        args.sampling_rate,
        args.dp_norm_bound,
        args.dp_norm_bound_quantile,
    )
    run_privacy_bench(args.out, args.devices, args.length, args.attack_devices, curve)
