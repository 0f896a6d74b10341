"""`fedspeech bench coldstart --listen`: the coldstart fleet's model after its rounds, heard by the listener.

The task is the README's ten commands with the product's none class, `_none_`: its negatives are the
bundled background noise (`_background_noise_`, as the built-in fsdd task has), whose windows train it, and
a device's `_unknown_` takes (other words its household said) train it too (models.clips.folders). So does
the first model's synthetic other speech (`--init synthetic`): common English words that are no command.

The fleet is `bench coldstart`'s (six devices of Speech Commands speakers, at most twenty takes a word);
each device also trains, as the product's devices do, on windows of the negatives as its none class, as
many as its commonest label has clips, with all of them mixed into its speech. Two arms start from the
synthetic first model and run FedAvg at `--lr 1e-3` (the README's advice with `--init synthetic`): with the
devices' own speakers' `_unknown_` takes in their none class, and without. Each final model is exported to
ONNX with its threshold calibrated (models.calibration) on the devices' own clips, summed over the devices
as the coordinator sums their counts; never on the unseen speakers. `bench listen` then hears it on a
stream of LISTEN_WORDS clips of the ten words by speakers no device holds, and the model's clip accuracy
is taken on the same clips (a clip heard as `_none_` is wrong): the must-show compares the two.
"""

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedspeech.models.clips.tasks import BACKGROUND_NOISE
from fedspeech.protocol.labels import NONE_LABEL
from fedspeech.protocol.messages import TaskDefinition
from fedspeech_bench.coldstart_fleet import WORDS, Fleet, build_fleet, fedavg_round
from fedspeech_bench.listen_bench import OTHER_WORDS

LISTEN_WORDS = 500  # clips of the unseen speakers in the stream
LEARNING_RATE = 1e-3  # the devices': the README's advice with --init synthetic
TALK = "talk, no command word"


@dataclass(frozen=True)
class ListenArm:
    """Whether the devices train their own speakers' `_unknown_` takes as the none class."""

    name: str
    own_others: bool


LISTEN_ARMS = (ListenArm("own other words", True), ListenArm("no own other words", False))


def listen_task() -> TaskDefinition:
    """The ten commands, 16 kHz, 1 s, with `_none_` trained on the bundled background noise."""
    from fedspeech.models.clips.tasks import task_from_mapping

    return task_from_mapping(
        {"name": "commands", "labels": WORDS, "sample_rate": 16000, "clip_seconds": 1.0,
         "negatives": [BACKGROUND_NOISE]}
    )  # fmt: skip


def own_clips(fleet: Fleet, device: int, own_others: bool) -> tuple[np.ndarray, np.ndarray]:
    """A device's clips of the words, and (own_others) its speakers' `_unknown_` takes as `_none_`."""
    waveforms, labels = fleet.devices[device]
    if not own_others:
        return waveforms, labels
    others = fleet.others[device]
    none = np.full(len(others), listen_task().labels.index(NONE_LABEL), dtype=np.int64)
    return np.concatenate([waveforms, others]), np.concatenate([labels, none])


def with_negatives(
    clips: tuple[np.ndarray, np.ndarray], negatives: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The clips and a fixed sample of the negative windows as `_none_`, as many as the commonest label has
    clips (as a device adds them: edge_client.local_data).
    """
    waveforms, labels = clips
    count = max(1, int(np.bincount(labels).max()))
    if len(negatives) > count:
        negatives = negatives[np.sort(np.random.default_rng(0).permutation(len(negatives))[:count])]
    none = np.full(len(negatives), listen_task().labels.index(NONE_LABEL), dtype=np.int64)
    return np.concatenate([waveforms, negatives]), np.concatenate([labels, none])


def negative_windows() -> np.ndarray:
    """The bundled background noise, one clip-length window a file."""
    from fedspeech.models.clips.datasets import Clip, bundled_data_dir, load_waveforms
    from fedspeech.models.clips.folders import list_negative

    paths = list_negative(bundled_data_dir(), BACKGROUND_NOISE)[0]
    return load_waveforms([Clip(path, 0, "", False) for path in paths], 16000, 16000)[0]


def federate(
    start: dict[str, np.ndarray], data: list[tuple[np.ndarray, np.ndarray]], negatives: np.ndarray,
    rounds: int, seed: int,
) -> dict[str, np.ndarray]:  # fmt: skip
    """rounds of FedAvg from start, each device training as `bench coldstart`'s do, with the negatives
    mixed into its speech and background windows as its none class.
    """
    from fedspeech.protocol.labels import none_class

    net, current, none = listen_net(), dict(start), none_class(listen_task().labels)
    for round in range(1, rounds + 1):
        current = fedavg_round(
            net, current, data, LEARNING_RATE, seed * 100_000 + round * 10, noise=negatives, none_class=none
        )
    return current


def listen_net() -> Any:
    """The listening task's model, as the coordinator builds it."""
    from fedspeech.models import build_model
    from fedspeech.models.clips.tasks import spec_for

    return build_model(spec_for(listen_task()))


def export_calibrated(
    arrays: dict[str, np.ndarray], clips: list[tuple[np.ndarray, np.ndarray]], path: Path, rounds: int
) -> tuple[float | None, str]:
    """Export the model to path (and its pair) with its threshold calibrated on the devices' clips; the
    threshold and where it came from.
    """
    from fedspeech.export.onnx_export import export_onnx
    from fedspeech.models.calibration import Decisions, calibrate, decision_counts
    from fedspeech.models.clips.tasks import spec_for
    from fedspeech.models.train import predict, set_arrays
    from fedspeech.protocol.labels import word_classes

    definition, net = listen_task(), listen_net()
    set_arrays(net, arrays)
    words = word_classes(definition.labels)
    parts = [
        Decisions(decision_counts(predict(net, *own)[0], own[1], words), f"device {n}'s {len(own[1])} clips")
        for n, own in enumerate(clips)
    ]
    threshold, source = calibrate(parts)
    spec = spec_for(definition)
    export_onnx(
        net, spec, definition.labels, path, round=rounds, task=definition.name, threshold=threshold, pair=True
    )
    return threshold, source


def clip_accuracy(arrays: dict[str, np.ndarray], test: tuple[np.ndarray, np.ndarray]) -> float:
    """The share of clips whose most likely class is their word (`_none_` is wrong)."""
    from fedspeech.models.train import predict, set_arrays

    net = listen_net()
    set_arrays(net, arrays)
    return float(np.mean(predict(net, *test)[0].argmax(axis=1) == test[1]))


def listen_sample(fleet: Fleet, seed: int) -> np.ndarray:
    """The indices of the unseen clips in the stream: LISTEN_WORDS of them, drawn with seed."""
    count = min(LISTEN_WORDS, len(fleet.unseen))
    return np.sort(np.random.default_rng([seed, 51]).permutation(len(fleet.unseen))[:count])


@dataclass(frozen=True)
class ListenResult:
    """One arm on one seed's fleet: its clip accuracies, threshold, and what the listener heard."""

    arm: str
    seed: int
    accuracy: float  # on every unseen clip
    stream_accuracy: float  # on the stream's clips
    threshold: float | None
    threshold_from: str
    heard: dict[str, tuple[float, str]]  # condition -> (figure, its unit): heard_figures


def heard_figures(results_json: Path, name: str) -> dict[str, tuple[float, str]]:
    """A model's figure in each condition of a `bench listen` results.json: words detected in order (% of
    those said), false detections an hour (no word said), or other words detected (% of those said).
    """
    import json

    figures = {}
    for r in json.loads(results_json.read_text())["models"][name]["results"]:
        if r["others"]:
            figures[r["condition"]] = (100 * r["insertions"] / r["others"], "% of other words detected")
        elif r["words"] == 0:
            figures[r["condition"]] = (r["false_per_hour"], "false detections an hour")
        else:
            figures[r["condition"]] = (100 * r["hits"] / r["words"], "% detected in order")
    return figures


def listen_report(results: list[ListenResult], rounds: int, takes: int) -> str:
    """The arms as a markdown table, mean ± SD over seeds: clip accuracies, the threshold, each condition's
    figure; then the must-show's three tests.
    """
    arms = [arm.name for arm in LISTEN_ARMS]
    seeds = sorted({r.seed for r in results})
    by_arm = {arm: [r for r in results if r.arm == arm] for arm in arms}

    def cell(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
        mean, sd = np.mean(values) * scale, np.std(values) * scale
        return f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if len(values) > 1 else "")

    first = by_arm[arms[0]][0]
    lines = [
        f"{len(seeds)} seed(s) of `bench coldstart`'s fleet, the task the ten commands and `_none_`, from "
        f"the synthetic first model ({takes} takes a word and {len(WORDS) * takes} of other speech), "
        f"{rounds} rounds of FedAvg at lr {LEARNING_RATE:g}; heard on {LISTEN_WORDS} clips of speakers no "
        "device holds. Mean ± SD over seeds.",
        "",
        "| | " + " | ".join(arms) + " |",
        "|---|" + "---|" * len(arms),
        "| clip accuracy, all unseen speakers' clips (%) | "
        + " | ".join(cell([r.accuracy for r in by_arm[a]], 100) for a in arms)
        + " |",
        "| clip accuracy, the stream's clips (%) | "
        + " | ".join(cell([r.stream_accuracy for r in by_arm[a]], 100) for a in arms)
        + " |",
        "| threshold (calibrated on the devices' clips) | "
        + " | ".join(cell([r.threshold or 0.0 for r in by_arm[a]], digits=2) for a in arms)
        + " |",
    ]
    for condition, (_, unit) in first.heard.items():
        cells = [cell([r.heard[condition][0] for r in by_arm[a]]) for a in arms]
        lines.append(f"| {condition}: {unit} | " + " | ".join(cells) + " |")
    lines += ["", "The must-show, on the mean over seeds:", ""]
    for arm in arms:
        own = by_arm[arm]
        margin = np.mean([r.heard["clean"][0] - 100 * r.stream_accuracy for r in own])
        talk = np.mean([r.heard[TALK][0] for r in own]) if TALK in first.heard else float("nan")
        others = (
            np.mean([r.heard[OTHER_WORDS][0] for r in own]) if OTHER_WORDS in first.heard else float("nan")
        )
        lines.append(
            f"- {arm}: clean words in order {margin:+.1f} points from clip accuracy ("
            f"{'met' if margin >= -3 else 'not met'}: >= -3); talk {talk:.1f} an hour ("
            f"{'met' if talk <= 2 else 'not met'}: <= 2); other words {others:.1f} % detected ("
            f"{'met' if others <= 1 else 'not met'}: <= 1 %)"
        )
    return "\n".join(lines)


def run_coldstart_listen(
    data_dir: Path, out: Path, seeds: int = 1, rounds: int = 20, takes: int = 100, epochs: int = 12,
    noise_minutes: float = 5.0, talk_minutes: float = 30.0,
) -> Path:  # fmt: skip
    """Train both arms on every seed's fleet, hear each final model; write results.md and results.json."""
    import json

    import torch

    from fedspeech.coordinator.model.pretraining import Pretraining, pretrained
    from fedspeech.models.clips.tasks import spec_for
    from fedspeech_bench.listen_bench import ListenBenchConfig, check_config, run_listen_bench
    from fedspeech_bench.listen_streams import Heard

    torch.set_num_threads(2)
    out.mkdir(parents=True, exist_ok=True)
    definition = listen_task()
    start = pretrained(
        definition, spec_for(definition), out / "state", True, None, Pretraining(takes, epochs)
    )
    negatives = negative_windows()
    results: list[ListenResult] = []
    for seed in range(seeds):
        fleet = build_fleet(data_dir, seed)
        chosen = listen_sample(fleet, seed)
        stream_test = (fleet.test[0][chosen], fleet.test[1][chosen])
        models, accuracies = {}, {}
        for arm in LISTEN_ARMS:
            clips = [own_clips(fleet, d, arm.own_others) for d in range(len(fleet.devices))]
            final = federate(start, [with_negatives(c, negatives) for c in clips], negatives, rounds, seed)
            path = out / f"seed{seed}-{arm.name.replace(' ', '-')}.onnx"
            calibration = export_calibrated(final, clips, path, rounds)
            accuracies[arm.name] = (
                clip_accuracy(final, fleet.test),
                clip_accuracy(final, stream_test),
                calibration,
            )
            models[arm.name] = path
            print(
                f"seed {seed}, {arm.name}: clip accuracy {accuracies[arm.name][1]:.3f} on the stream's "
                f"clips, threshold {calibration[0]}",
                flush=True,
            )
        held = frozenset(s for group in fleet.speakers for s in group)
        clips_heard = tuple(replace(fleet.unseen[i], label=int(fleet.test[1][i])) for i in chosen)
        heard = Heard(clips_heard, tuple(WORDS), held, TALK)
        cfg = ListenBenchConfig(
            models, out / f"listen-seed{seed}", data_dir, seed=seed, noise_minutes=noise_minutes,
            talk_minutes=talk_minutes, command=f"bench coldstart --listen, seed {seed}", heard=heard,
        )  # fmt: skip
        check_config(cfg)
        run_listen_bench(cfg)
        for arm in LISTEN_ARMS:
            accuracy, stream_accuracy, (threshold, source) = accuracies[arm.name]
            figures = heard_figures(cfg.out / "results.json", arm.name)
            results.append(
                ListenResult(arm.name, seed, accuracy, stream_accuracy, threshold, source, figures)
            )
    text = listen_report(results, rounds, takes)
    print(text)
    (out / "results.md").write_text(f"# bench coldstart --listen\n\n{text}\n")
    (out / "results.json").write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return out / "results.md"
