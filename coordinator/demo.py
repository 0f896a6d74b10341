"""`fedspeech demo`: a coordinator and one device process per FSDD speaker, end to end on one machine."""

import json
import logging
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fedspeech.coordinator.app import create_app, serve
from fedspeech.coordinator.store import RoundRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs and where it writes."""

    out: Path
    rounds: int = 30
    epochs: int | None = None  # None: the coordinator's default
    broker_url: str | None = None
    port: int = 0
    max_samples: int | None = None
    round_timeout_s: float = 300.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn_clients(speakers: list[str], coordinator_url: str, broker_url: str, cfg: DemoConfig) -> list:
    logs = cfg.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for speaker in speakers:
        cmd = [sys.executable, "-m", "fedspeech", "client", "--speaker", speaker]
        cmd += ["--coordinator", coordinator_url, "--broker", broker_url]
        if cfg.max_samples:
            cmd += ["--max-samples", str(cfg.max_samples)]
        with open(logs / f"client-{speaker}.log", "w") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT))
    return procs


def _stop_clients(procs: list) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def _line(r: RoundRecord, t0: float) -> str:
    acc = f"{r.accuracy:.4f}" if r.accuracy is not None else "n/a"
    loss = f"{r.loss:.4f}" if r.loss is not None else "n/a"
    return (
        f"round {r.round:3d}  devices {r.results}/{r.devices}  accuracy {acc}  loss {loss}  "
        f"{r.wall_s:6.1f} s (total {r.finished_at - t0:6.1f} s)  "
        f"up {r.bytes_up / 1e6:.2f} MB  down {r.bytes_down / 1e6:.2f} MB"
    )


def write_plot(records: list[dict], path: Path) -> None:
    """Accuracy against round and against wall time, side by side, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_round, by_time) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    rounds = [r["round"] for r in records]
    acc = [r["accuracy"] for r in records]
    by_round.plot(rounds, acc, marker="o")
    by_round.set(xlabel="round", ylabel="held-out accuracy", title="accuracy per round")
    by_time.plot([r["elapsed_s"] for r in records], acc, marker="o")
    by_time.set(xlabel="wall time (s)", title="accuracy over time")
    for ax in (by_round, by_time):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_demo(cfg: DemoConfig) -> dict:
    """Train FedAvg across the FSDD speakers, then write model.onnx, metrics.json and accuracy.png."""
    from fedspeech.models.datasets import load_corpus, speakers

    out = cfg.out
    state = out / "state"
    shutil.rmtree(state, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus("fsdd")
    fleet = speakers(corpus)
    t0 = time.time()
    config = {
        "STATE_DIR": str(state),
        "BROKER_URL": cfg.broker_url,
        "EMBEDDED_BROKER_PORT": free_port(),
        "CORPUS": "fsdd",
        "ROUNDS": cfg.rounds,
        "MIN_DEVICES": len(fleet),
        "MIN_RESULTS": max(1, len(fleet) - 1),
        "ROUND_TIMEOUT_S": cfg.round_timeout_s,
    }
    if cfg.epochs is not None:
        config["EPOCHS"] = cfg.epochs
    app = create_app(config)
    service = app.extensions["fedspeech"]
    service.start()
    server = serve(app, "127.0.0.1", cfg.port)
    url = f"http://127.0.0.1:{server.server_port}"
    print(f"coordinator on {url}, broker {service.broker_url}, {len(fleet)} devices: {', '.join(fleet)}")
    procs = _spawn_clients(fleet, url, service.broker_url, cfg)
    printed, progress_at = 0, time.time()
    try:
        while not service.orchestrator.finished.is_set():
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a device process exited early; see {out / 'logs'}")
            if time.time() - progress_at > cfg.round_timeout_s + 60:
                raise RuntimeError(
                    f"no round completed in {cfg.round_timeout_s + 60:.0f} s; see {out / 'logs'}"
                )
            for r in service.store.rounds()[printed:]:
                print(_line(r, t0), flush=True)
                printed, progress_at = printed + 1, time.time()
            time.sleep(0.5)
        for r in service.store.rounds()[printed:]:
            print(_line(r, t0), flush=True)
    finally:
        _stop_clients(procs)
        server.shutdown()
        service.stop()
    return _write_results(service.store, service.orchestrator.model, out, t0)


def _write_results(store, model, out: Path, t0: float) -> dict:
    from fedspeech.protocol import weights

    rounds = store.rounds()
    final = rounds[-1]
    shutil.copyfile(store.model_path(final.round, "onnx"), out / "model.onnx")
    arrays, _ = weights.decode(store.model_path(final.round, "weights").read_bytes())
    check = model.parity(arrays, out / "model.onnx")
    records = [{**asdict(r), "elapsed_s": r.finished_at - t0} for r in rounds]
    summary = {
        "round": final.round,
        "accuracy": final.accuracy,
        "macro_f1": final.macro_f1,
        "loss": final.loss,
        "wall_s": time.time() - t0,
        "bytes_up": sum(r.bytes_up for r in rounds),
        "bytes_down": sum(r.bytes_down for r in rounds),
        "onnx_agreement": check.agreement,
        "onnx_max_abs_diff": check.max_abs_diff,
        "heldout_clips": int(len(model.heldout[1])),
    }
    (out / "metrics.json").write_text(json.dumps({"rounds": records, "final": summary}, indent=2))
    write_plot(records, out / "accuracy.png")
    print(
        f"final: round {final.round}, accuracy {final.accuracy:.4f}, macro-F1 {final.macro_f1:.4f}, "
        f"ONNX agrees with torch on {check.agreement:.2%} of {summary['heldout_clips']} held-out clips, "
        f"{summary['wall_s']:.0f} s in all"
    )
    print(f"wrote {out / 'model.onnx'}, {out / 'metrics.json'}, {out / 'accuracy.png'}")
    return summary
