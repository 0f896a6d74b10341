"""`fedspeech bench coldstart`: a new fleet with little speech, from scratch against a first model trained
on synthetic speech, and ways of fine-tuning from it.

The fleet is six devices of Speech Commands speakers (`speech_commands_test/`), each one to three
speakers, at most twenty takes of each of the ten command words; three of them miss three words each.
The model is scored on speakers no device holds. The fleet is simulated in this process, with the
product's own training step and settings (2 epochs, batch 16) and FedAvg; the synthetic start is the
coordinator's own `--init synthetic` model (coordinator.pretraining), made once and cached; the takes
mixed into a device's clips are spoken for it as `fedspeech client --mix-synthetic` speaks them, with a
seed of its own. Each arm runs the same fleets, one per seed.
"""

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedspeech_bench.coldstart_fleet import (
    DEVICES,
    MAX_TAKES,
    MISSING,
    WORDS,
    Fleet,
    build_fleet,
    fedavg_round,
)

MARKS = (0, 1, 2, 3, 4, 5, 7, 10, 15, 20)  # rounds scored
REPORTED = (0, 1, 5, 10, 20)  # rounds in the table


@dataclass(frozen=True)
class Arm:
    """How a fleet starts and fine-tunes."""

    name: str
    synthetic: bool  # start from the synthetic first model, else from random weights
    learning_rate: float = 3e-3  # the devices' (the coordinator's default)
    mixed: int = 0  # synthetic takes of each word added to each device's own clips


ARMS = (
    Arm("from scratch", False),
    Arm("synthetic start", True),
    Arm("synthetic start, lr 1e-3", True, 1e-3),
    Arm("synthetic start, 10 synthetic takes a word mixed in", True, mixed=10),
    Arm("synthetic start, lr 1e-3, 10 synthetic takes a word mixed in", True, 1e-3, mixed=10),
)


@dataclass(frozen=True)
class Curve:
    """One arm on one seed's fleet: accuracy on the unseen speakers at each scored round, bytes moved."""

    arm: str
    seed: int
    rounds: list[int]
    accuracies: list[float]
    bytes_moved: int  # every device's download and upload of every round


def run_arm(
    arm: Arm, fleet: Fleet, start: dict[str, np.ndarray], synthetic_dir: Path, seed: int, rounds: int
) -> Curve:
    """Train the fleet for rounds rounds from start, FedAvg, scoring the unseen speakers at MARKS."""
    from fedspeech.models.train import predict, set_arrays

    net, data = _net(), []
    for n, (waveforms, labels) in enumerate(fleet.devices):
        if arm.mixed:  # what `fedspeech client --mix-synthetic` trains on: the device's own takes
            spoken = device_takes(arm.mixed, synthetic_dir, seed * DEVICES + n)
            waveforms, labels = np.concatenate([waveforms, spoken[0]]), np.concatenate([labels, spoken[1]])
        data.append((waveforms, labels))

    def accuracy(arrays: dict[str, np.ndarray]) -> float:
        set_arrays(net, arrays)
        probabilities, _ = predict(net, *fleet.test)
        return float(np.mean(probabilities.argmax(axis=1) == fleet.test[1]))

    current = dict(start)
    size = sum(a.nbytes for a in current.values())
    marks, scores = [0], [accuracy(current)]
    for round in range(1, rounds + 1):
        current = fedavg_round(net, current, data, arm.learning_rate, seed * 100_000 + round * 10)
        if round in MARKS or round == rounds:
            marks.append(round)
            scores.append(accuracy(current))
    return Curve(arm.name, seed, marks, scores, 2 * size * len(data) * rounds)


def device_takes(takes: int, root: Path, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A device's synthetic takes of each word, spoken as `fedspeech client --mix-synthetic` speaks them."""
    from fedspeech.models.clips.datasets import load_waveforms
    from fedspeech.models.clips.folders import list_folder
    from fedspeech.models.clips.synthetic import takes_folder

    return load_waveforms(list_folder(takes_folder(task(), root, takes, seed), WORDS)[0], 16000, 16000)


def _net() -> Any:
    """The task's model, as the coordinator builds it."""
    from fedspeech.models import build_model
    from fedspeech.models.clips.tasks import spec_for

    return build_model(spec_for(task()))


def task() -> Any:
    """The README's own task: ten command words, 16 kHz, 1 s."""
    from fedspeech.models.clips.tasks import task_from_mapping

    return task_from_mapping({"name": "commands", "labels": WORDS, "sample_rate": 16000, "clip_seconds": 1.0})


def first_reached(curve: Sequence[tuple[int, float]], target: float) -> int | None:
    """The first scored round whose accuracy reaches target; None if none does."""
    return next((r for r, a in curve if a >= target), None)


def run_coldstart(
    data_dir: Path, out: Path, seeds: int = 3, rounds: int = 20, arms: Sequence[Arm] = ARMS,
    takes: int = 300, epochs: int = 12,
) -> Path:  # fmt: skip
    """Run every arm on every seed's fleet; write results.md, results.json and accuracy-rounds.png."""
    import torch

    from fedspeech.coordinator.model.pretraining import Pretraining, pretrained
    from fedspeech.models.clips.tasks import spec_for
    from fedspeech.models.train import get_arrays, predict, set_arrays

    torch.set_num_threads(2)
    out.mkdir(parents=True, exist_ok=True)
    definition = task()
    made_before = any((out / "state" / "pretrained").glob("*.safetensors"))
    started = time.monotonic()
    start = pretrained(
        definition, spec_for(definition), out / "state", True, None, Pretraining(takes, epochs)
    )
    pretrain_s = None if made_before else time.monotonic() - started
    torch.manual_seed(0)
    scratch = get_arrays(_net())
    curves: list[Curve] = []
    for seed in range(seeds):
        fleet = build_fleet(data_dir, seed)
        clips = [len(labels) for _, labels in fleet.devices]
        print(
            f"seed {seed}: devices of {clips} clips, {len(fleet.test[1])} clips of unseen speakers",
            flush=True,
        )
        for arm in arms:
            curve = run_arm(arm, fleet, start if arm.synthetic else scratch, out / "devices", seed, rounds)
            curves.append(curve)
            print(f"  {arm.name}: {curve.accuracies[-1]:.3f} after {rounds} rounds", flush=True)
    # the synthetic-only model on every clip of the ten words in the corpus' speakers
    net = _net()
    set_arrays(net, start)
    everyone = build_fleet(data_dir, 0).test  # unseen speakers of seed 0
    probabilities, _ = predict(net, *everyone)
    synthetic_only = float(np.mean(probabilities.argmax(axis=1) == everyone[1]))
    text = report(curves, arms, rounds, synthetic_only, pretrain_s, takes * len(WORDS))
    print(text)
    plot = accuracy_plot(curves, arms, out)
    (out / "results.md").write_text(
        f"# bench coldstart\n\n{text}\n\n![accuracy against round]({plot.name})\n"
    )
    results = {
        "curves": [asdict(c) for c in curves],
        "synthetic_only": synthetic_only,
        "pretrain_s": pretrain_s,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return out / "results.md"


def report(
    curves: Sequence[Curve],
    arms: Sequence[Arm],
    rounds: int,
    synthetic_only: float,
    pretrain_s: float | None,
    takes: int,
) -> str:
    """The arms as a markdown table: mean accuracy (and spread over seeds) at REPORTED rounds, the round
    each first reaches from scratch's final accuracy, and the bytes moved.
    """
    seeds = sorted({c.seed for c in curves})
    final = float(np.mean([c.accuracies[-1] for c in curves if c.arm == arms[0].name]))
    marks = [r for r in REPORTED if r <= rounds]
    made = "taken from an earlier run's cache" if pretrain_s is None else f"made in {pretrain_s:.0f} s"
    lines = [
        f"{len(seeds)} seeds: six devices of Speech Commands speakers, at most {MAX_TAKES} takes of each "
        f"of ten words, three missing {MISSING} words; accuracy on speakers no device holds. The synthetic "
        f"first model trained on {takes} synthetic takes ({made}); alone it scores "
        f"{synthetic_only:.3f} on seed 0's unseen speakers.",
        "",
        "| arm | "
        + " | ".join(f"round {r}" for r in marks)
        + f" | first round at scratch's final {final:.3f} | MB moved |",
        "|---|" + "---|" * (len(marks) + 2),
    ]
    for arm in arms:
        own = [c for c in curves if c.arm == arm.name]
        cells = []
        for r in marks:
            values = [c.accuracies[c.rounds.index(r)] for c in own]
            cells.append(f"{np.mean(values):.3f} ± {np.std(values):.3f}")
        mean = list(zip(own[0].rounds, np.mean([c.accuracies for c in own], axis=0), strict=True))
        reached = first_reached(mean, final)
        moved = own[0].bytes_moved / 1e6
        first = "never" if reached is None else str(reached)
        lines.append(f"| {arm.name} | {' | '.join(cells)} | {first} | {moved:.1f} |")
    return "\n".join(lines)


def accuracy_plot(curves: Sequence[Curve], arms: Sequence[Arm], out: Path) -> Path:
    """Mean accuracy on the unseen speakers against round, one line per arm, the seeds' spread shaded."""
    from fedspeech_bench.report.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for arm in arms:
        own = [c for c in curves if c.arm == arm.name]
        values = np.array([c.accuracies for c in own])
        mean, spread = values.mean(axis=0), values.std(axis=0)
        ax.plot(own[0].rounds, mean, marker="o", label=arm.name)
        ax.fill_between(own[0].rounds, mean - spread, mean + spread, alpha=0.15)
    ax.set(xlabel="round", ylabel="accuracy on unseen speakers", ylim=(0, 1))
    ax.legend(fontsize=8)
    ax.set_title("a new fleet with little speech: six devices, at most 20 takes a word")
    fig.tight_layout()
    path = out / "accuracy-rounds.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `bench coldstart` to the `bench` subcommands."""
    p = bench_subparsers.add_parser(
        "coldstart", help="a new fleet with little speech: from scratch against a synthetic first model"
    )
    p.add_argument("--data-dir", type=Path, required=True, help="folder holding speech_commands_test/")
    p.add_argument("--seeds", type=int, default=3, help="fleets, one per seed (default 3)")
    p.add_argument("--rounds", type=int, default=20, help="rounds of each arm (default 20)")
    p.add_argument("--takes", type=int, default=300, help="synthetic takes of each word (default 300)")
    p.add_argument("--epochs", type=int, default=12, help="epochs the first model trains (default 12)")
    p.add_argument("--out", type=Path, default=Path("fedspeech-bench-coldstart"), help="where results go")
    p.add_argument(
        "--listen", action="store_true",
        help="the ten commands with a none class, heard by `fedspeech listen` after the rounds, with and "
        "without the devices' own other words (needs emodb/ in --data-dir too)",
    )  # fmt: skip
    p.set_defaults(run=run_from_args)


def run_from_args(args: argparse.Namespace) -> None:
    """`fedspeech bench coldstart`: check the options, then run."""
    bounds = {"seeds": (1, 20), "rounds": (1, 500), "takes": (1, 5000), "epochs": (1, 1000)}
    for name, (low, high) in bounds.items():
        if not low <= getattr(args, name) <= high:
            raise SystemExit(f"fedspeech bench coldstart: --{name} must be from {low} to {high}")
    if not (args.data_dir / "speech_commands_test").is_dir():
        raise SystemExit(f"fedspeech bench coldstart: no speech_commands_test/ in {args.data_dir}")
    if args.listen:
        from fedspeech_bench.coldstart_listen import run_coldstart_listen

        run_coldstart_listen(args.data_dir, args.out, args.seeds, args.rounds, args.takes, args.epochs)
        return
    run_coldstart(args.data_dir, args.out, args.seeds, args.rounds, ARMS, args.takes, args.epochs)
