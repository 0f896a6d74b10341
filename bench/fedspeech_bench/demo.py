"""`fedspeech demo`: a coordinator and an emulated Pi fleet, one device per FSDD speaker, on one machine.

After training it checks the exported ONNX model against torch, and listens with it to a file of
held-out digits as `fedspeech listen --input` does; it ends with where its time went.
"""

import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fedspeech.coordinator.state.records import RoundRecord
from fedspeech.models.clips.datasets import load_corpus, server_test_clips, speakers
from fedspeech_bench.demo_defaults import DEMO_EPOCHS, DEMO_FLEET, DEMO_ROUNDS
from fedspeech_bench.fleet_run import fleet_config, fleet_run
from fedspeech_bench.fleets.fleet_files import FLEETS_DIR, DeviceSpec, check_fleet, load_fleet
from fedspeech_bench.run_progress import duration_text, eta_s

log = logging.getLogger(__name__)


# Of the strategies that reached 0.97 on the Pi-mix fleet (`fedspeech bench strategies`), the fastest:
# every device trains each round, the slow ones for fewer epochs, so no one waits long for a Pi 3.
DEMO_STRATEGY = "epochs_only"
# --full-speed runs every device on this one machine: what their profiles measure there is each other's
# load, not their hardware. Measured, epochs_only then gave each device 1 to 3 epochs a round by turns
# (10 to 12 a round in all without secure aggregation, 10.9 on average; 8 to 12 with it, 10.2, its work
# on the keys loading the machine more), and the secure sum fell behind the plain one. Alike devices
# train alike epochs.
FULL_SPEED_STRATEGY = "fedavg"
# Each device holds one speaker's voice, and plain averaging drifts between them: a learning rate falling
# to a tenth along a cosine and server momentum (FedAvgM) took the clip accuracy of an in-process run of
# this fleet's data from 0.970 to 0.990 in 30 rounds.
DEMO_FINAL_LR_FRACTION = 0.1
DEMO_SERVER_MOMENTUM = 0.8
# With --synthetic its none class hears speech that is no digit, so that fewer words said near the listener
# are taken for one: the first model is trained on the digits and common other words spoken by the
# machine's synthesizers, and each device trains on a few takes of them beside its own clips (README: A
# first model from synthetic speech)
DEMO_INIT_TAKES = 100  # of each digit, and ten times as many of other speech
DEMO_MIX_SYNTHETIC = 10  # takes of each digit on each device, and ten times as many of other speech
LISTEN_WORDS = 10  # held-out digits in the file the demo listens to
LISTEN_PAUSE_S = 0.6  # of silence around each, as in `fedspeech bench listen`


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs and where it writes."""

    out: Path
    fleet: Path | None = FLEETS_DIR / f"{DEMO_FLEET}.toml"  # None: one full-speed device per FSDD speaker
    strategy: str = DEMO_STRATEGY
    rounds: int = DEMO_ROUNDS
    epochs: int = DEMO_EPOCHS  # of the fastest devices; the strategy may give slower ones fewer
    broker_url: str | None = None
    port: int = 0
    max_samples: int | None = None
    round_timeout_s: float = 300.0
    # the devices evaluate every few rounds: a Pi 3 takes seconds to fetch and score the model, and the
    # coordinator's held-out set scores every round anyway
    eval_every: int = 5
    secure_aggregation: bool = False  # the coordinator sees only each round's sum of updates
    synthetic: bool = False  # a first model from synthetic speech, synthetic takes mixed in on the devices
    seed: int = 0  # the coordinator's: the first model's weights, and the seed of each device's task
    privacy: Mapping[str, Any] = field(default_factory=dict)  # dp_* settings: differential privacy
    defences: Mapping[str, Any] = field(default_factory=dict)  # norm_bound, direction_check, if not default


def federated_text(r: RoundRecord) -> str:
    """The round's federated evaluation in words: its accuracy and reports, or why there is none."""
    if r.evaluation_asked is None:
        return "not evaluated on the devices"
    reports = f"{r.evaluation_reports} of {r.evaluation_asked} devices"
    if r.federated_accuracy is None:
        return f"too few reports ({reports})"
    return f"{r.federated_accuracy:.4f} ({reports})"


def round_line(r: RoundRecord, rounds: int, t0: float, round_ends: list[float]) -> str:
    """A round's line: of how many, scores, time (and left: run_progress.eta_s of round_ends), bytes."""
    acc = f"{r.accuracy:.4f}" if r.accuracy is not None else "n/a"
    loss = f"{r.loss:.4f}" if r.loss is not None else "n/a"
    federated = "" if r.evaluation_asked is None else f"on the devices {federated_text(r)}  "
    left = eta_s([], 0, rounds, round_ends, r.finished_at - t0)
    about = f", about {duration_text(left)} left" if left is not None else ""
    return (
        f"round {r.round:3d}/{rounds}  devices {r.results}/{r.devices}  accuracy {acc}  loss {loss}  "
        f"{federated}{r.wall_s:6.1f} s (total {r.finished_at - t0:6.1f} s{about})  "
        f"up {r.bytes_up / 1e6:.2f} MB  down {r.bytes_down / 1e6:.2f} MB"
    )


def round_printer(rounds: int, t0: float) -> Callable[[RoundRecord], None]:
    """Prints each round's line as it comes, with the time left at the pace of the rounds so far."""
    round_ends: list[float] = []  # from t0 to the end of each round from round 1

    def show(r: RoundRecord) -> None:
        if r.round > 0:
            round_ends.append(r.finished_at - t0)
        print(round_line(r, rounds, t0, round_ends), flush=True)

    return show


def write_plot(records: list[dict], path: Path) -> None:
    """Accuracy against round and against wall time, side by side, as a PNG."""
    from fedspeech_bench.report.plots import pyplot

    plt = pyplot()

    fig, (by_round, by_time) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    rounds = [r["round"] for r in records]
    elapsed = [r["elapsed_s"] for r in records]
    curves = {
        "coordinator's held-out set": [r["accuracy"] for r in records],
        "devices' own test clips (federated)": [r["federated_accuracy"] for r in records],
    }
    styles = [{"marker": "o"}, {"marker": "s", "linestyle": "--", "markerfacecolor": "none"}]
    for (name, values), style in zip(curves.items(), styles, strict=True):
        # a round without a score is left out, never drawn as a zero
        points = [(r, t, v) for r, t, v in zip(rounds, elapsed, values, strict=True) if v is not None]
        if points:
            by_round.plot([p[0] for p in points], [p[2] for p in points], label=name, **style)
            by_time.plot([p[1] for p in points], [p[2] for p in points], label=name, **style)
    by_round.set(xlabel="round", ylabel="accuracy", title="accuracy per round")
    by_time.set(xlabel="wall time (s)", title="accuracy over time")
    for ax in (by_round, by_time):
        ax.grid(alpha=0.3)
    by_round.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def listen_to_digits(model: Path, wav: Path) -> tuple[list[str], list[str]]:
    """Write held-out digits to wav, hear them as `fedspeech listen --input` does: (spoken, heard) words."""
    from fedspeech.runtime.session import load_model
    from fedspeech_bench.listen_bench import hear
    from fedspeech_bench.listen_streams import build_stream

    corpus = load_corpus("fsdd")
    rate = load_model(model).sample_rate
    clips = server_test_clips(corpus)  # the coordinator's held-out set: no device trained on them
    stream = build_stream(clips, corpus.labels, rate, LISTEN_PAUSE_S, seed=0, words=LISTEN_WORDS)
    detections = sorted(hear(model, stream, wav), key=lambda d: d.time_s)
    return [w.label for w in stream.words], [d.label for d in detections]


def durations(t0: float, ends: dict[str, float]) -> dict[str, float]:
    """Seconds of each phase (in order, name -> when it ended), from the end of the one before (or t0)."""
    seconds, start = {}, t0
    for name, end in ends.items():
        seconds[name], start = end - start, end
    return seconds


def synthesizers_found() -> bool:
    """Whether the machine has a speech synthesizer; if not, says once what the demo does without."""
    from fedspeech.models.clips.synthesizers import available_voices

    if available_voices():
        return True
    print(
        "no speech synthesizer (apt-get install espeak-ng): the demo starts from random weights, and its "
        "none class hears no speech that is no digit, so other words said near the listener are heard as "
        "digits"
    )
    return False


def fresh_state(out: Path) -> None:
    """A new fleet in out: a new coordinator key and new device tokens, but the synthetic takes and the
    first model trained on them kept from a run before (they depend on nothing of the fleet's).
    """
    kept = {"synthetic", "pretrained"}
    for folder in [out / "state", *(out / "devices").glob("*")]:
        if folder.is_dir():
            for entry in folder.iterdir():
                if entry.name in kept:
                    continue
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()


def run_demo(cfg: DemoConfig) -> dict:
    """Train on a fleet of FSDD speaker devices, check and listen; write the model, audio, metrics, plot."""
    if cfg.fleet is None:
        fleet = [DeviceSpec(s, s, cpu_share=1.0) for s in speakers(load_corpus("fsdd"))]
    else:
        fleet = load_fleet(cfg.fleet)
        check_fleet(fleet)
    fresh_state(cfg.out)
    cfg.out.mkdir(parents=True, exist_ok=True)
    config = fleet_config(fleet, "fsdd", cfg.out, broker_url=cfg.broker_url)
    synthetic = cfg.synthetic and synthesizers_found()
    if synthetic:
        config = config.changed(init="synthetic", init_takes=DEMO_INIT_TAKES)
        print(
            "the first model: the digits and other words spoken by this machine's synthesizers, then "
            f"trained on (minutes, once: kept in {cfg.out / 'state'}); each device speaks its own takes too"
        )
    rounds = replace(
        config.rounds,
        rounds=cfg.rounds,
        round_timeout=cfg.round_timeout_s,
        strategy=cfg.strategy,
        **cfg.privacy,
        **cfg.defences,
        eval_every=cfg.eval_every,
        final_lr_fraction=DEMO_FINAL_LR_FRACTION,
        server_momentum=DEMO_SERVER_MOMENTUM,
        epochs=cfg.epochs,
        secure_aggregation=cfg.secure_aggregation,
        seed=cfg.seed,
    )
    device_args = ["--max-samples", str(cfg.max_samples)] if cfg.max_samples else []
    device_args += ["--mix-synthetic", str(DEMO_MIX_SYNTHETIC)] if synthetic else []
    t0 = time.time()
    with fleet_run(
        fleet, "fsdd", cfg.out, replace(config, rounds=rounds), port=cfg.port, device_args=device_args
    ) as run:
        names = ", ".join(
            d.name if cfg.fleet is None else f"{d.name} ({d.cpu_share:g} core, +{d.delay_ms:g} ms)"
            for d in fleet
        )
        print(f"coordinator on {run.url}, broker {run.service.broker_url}, strategy {cfg.strategy}")
        print(f"watch it at {run.url}/ while it runs")
        print(f"{len(fleet)} devices: {names}")
        run.wait(cfg.round_timeout_s + 60, round_printer(cfg.rounds, t0))
        first = run.service.store.rounds()[1]
        # the start ends with the first round's: the coordinator's first model and the devices' warm-up
        # run side by side, and the slowest device to start sets its length
        ends = {"start": first.started_at, f"{cfg.rounds} rounds": time.time()}
    ends["fleet stop"] = time.time()
    return _write_results(run.service.store, run.service.orchestrator.model, cfg.out, t0, ends)


def _write_results(store, model, out: Path, t0: float, ends: dict[str, float]) -> dict:
    from fedspeech.protocol import weights
    from fedspeech.protocol.onnx_metadata import pair_paths
    from fedspeech_bench.word_alignment import align

    rounds = store.rounds()
    final = rounds[-1]
    shutil.copyfile(store.model_path(final.round, "onnx"), out / "model.onnx")
    # its two graphs beside it, which `fedspeech listen --model` takes: the front-end runs on new frames only
    for kind, path in zip(("frontend", "classifier"), pair_paths(out / "model.onnx"), strict=True):
        shutil.copyfile(store.model_path(final.round, kind), path)
    arrays, _ = weights.decode(store.model_path(final.round, "weights").read_bytes())
    check = model.parity(arrays, out / "model.onnx")
    ends["ONNX check"] = time.time()
    spoken, heard = listen_to_digits(out / "model.onnx", out / "digits.wav")
    ends["listening"] = time.time()
    records = [{**asdict(r), "elapsed_s": r.finished_at - t0} for r in rounds]
    write_plot(records, out / "accuracy.png")
    ends["writing"] = time.time()
    summary = {
        "round": final.round,
        "accuracy": final.accuracy,
        "macro_f1": final.macro_f1,
        "federated_accuracy": final.federated_accuracy,
        "federated_macro_f1": final.federated_macro_f1,
        "loss": final.loss,
        "wall_s": ends["writing"] - t0,
        "phases_s": durations(t0, ends),
        "bytes_up": sum(r.bytes_up for r in rounds),
        "bytes_down": sum(r.bytes_down for r in rounds),
        "onnx_agreement": check.agreement,
        "onnx_max_abs_diff": check.max_abs_diff,
        "heldout_clips": int(len(model.heldout[1])),
        "listening": {"spoken": spoken, "heard": heard, "in_order": align(spoken, heard).hits},
    }
    (out / "metrics.json").write_text(json.dumps({"rounds": records, "final": summary}, indent=2))
    print(
        f"final: round {final.round}, accuracy {final.accuracy:.4f}, macro-F1 {final.macro_f1:.4f}, "
        f"on the devices {federated_text(final)}, "
        f"ONNX agrees with torch on {check.agreement:.2%} of {summary['heldout_clips']} held-out clips"
    )
    print(
        f"listening to {out / 'digits.wav'} ({len(spoken)} held-out digits): spoken {' '.join(spoken)}, "
        f"heard {' '.join(heard) or 'nothing'} ({summary['listening']['in_order']} of {len(spoken)} in order)"
    )
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in summary["phases_s"].items())
    print(f"time: {phases}; {summary['wall_s']:.0f} s in all")
    print(
        f"wrote {out / 'model.onnx'} (and its two graphs beside it), {out / 'digits.wav'}, "
        f"{out / 'metrics.json'}, {out / 'accuracy.png'}"
    )
    print(f"listen yourself: fedspeech listen --model {out / 'model.onnx'} --input {out / 'digits.wav'}")
    return summary
