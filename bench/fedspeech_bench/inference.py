"""`fedspeech bench inference`: how fast and light the exported model runs on one core.

In one run, on the same windows of real audio: per-window latency of the fp32 and int8 ONNX models, of
the fp32 model as two graphs as a stream runs them (the front-end on one hop's new frames, then the
classifier on the window's frames; the graphs beside the model's file, else exported from it) and of
torch eager, taking turns in blocks of BLOCK windows so that machine noise falls on all three alike
while each runs with its own data in the caches (turns window by window made ONNX fp32 about 1.4x
slower than alone, torch evicting its caches between every two calls); the floor (the model's
FLOPs over this core's single-thread matrix-multiply rate, measured now); and `fedspeech listen` as a
process of its own: CPU share and peak RSS while it listens in real time, and cold start to first
detection.
"""

import json
import logging
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import soundfile

from fedspeech.export.graph import initializers
from fedspeech.export.quantize import quantize
from fedspeech.protocol import onnx_metadata as meta
from fedspeech.protocol.messages import ModelSpec
from fedspeech.runtime.session import ModelError, OnnxModel, PairedModel, load_local, load_model
from fedspeech.runtime.streaming import DetectorConfig

GAP_S = 0.8  # silence between the words of the listening test
SETTLE_S = 3.0  # the listener has started and loaded its model by then (cold start: about 0.4 s)
BLOCK = 50  # windows an engine runs in a row before the next takes its turn
PAIR_ENGINE = "onnx fp32 pair, one hop"  # the front-end on a hop's new frames, then the classifier
# onnxruntime's advice to whoever writes a quantisation script, logged on the root logger at every call
_QUANTISATION_ADVICE = re.compile(r"Please consider (to run )?pre-processing before quantization")


class BenchError(Exception):
    """What keeps the benchmark from measuring (the model, its corpus, the listener); the text says what."""


def _not_advice(record: logging.LogRecord) -> bool:
    return not _QUANTISATION_ADVICE.match(record.getMessage())


@dataclass(frozen=True)
class Engine:
    """One way of running the model: its latency per window, accuracy and file size."""

    name: str
    median_ms: float
    p95_ms: float
    accuracy: float
    size_bytes: int | None


@dataclass(frozen=True)
class InferenceReport:
    """Everything `bench inference` measured."""

    model: str
    engines: list[Engine]
    mflop_per_window: float
    matmul_gflops: float
    floor_ms: float
    listen_cpu_share: float  # of the whole run, start-up included
    listen_steady_share: float  # once started: from SETTLE_S after launch to the end
    listen_peak_rss_mb: float
    listen_audio_s: float
    listen_detections: int
    cold_start_s: float

    def markdown(self) -> str:
        """The report as markdown."""
        lines = [
            f"### inference on one core: {self.model}",
            "",
            "| engine | median (ms) | p95 (ms) | vs floor | held-out accuracy | file (KB) |",
            "|---|---|---|---|---|---|",
        ]
        for e in self.engines:
            size = f"{e.size_bytes / 1e3:.1f}" if e.size_bytes else "-"
            lines.append(
                f"| {e.name} | {e.median_ms:.3f} | {e.p95_ms:.3f} | {e.median_ms / self.floor_ms:.1f}x "
                f"| {e.accuracy:.4f} | {size} |"
            )
        lines += [
            "",
            f"- floor: {self.mflop_per_window:.2f} MFLOP per window / {self.matmul_gflops:.1f} GFLOP/s "
            f"single-thread matmul = {self.floor_ms:.3f} ms",
            f"- `fedspeech listen` in real time on {self.listen_audio_s:.1f} s of audio: "
            f"{self.listen_steady_share:.1%} of a core once started ({self.listen_cpu_share:.1%} with "
            f"start-up), peak RSS {self.listen_peak_rss_mb:.1f} MB, {self.listen_detections} detections",
            f"- cold start to first detection: {self.cold_start_s:.2f} s",
        ]
        return "\n".join(lines) + "\n"


def spec_of(model: OnnxModel) -> ModelSpec:
    """The model spec an exported file was made from, read from its metadata."""
    meta = model.metadata
    depth = int(meta["depth"]) if "depth" in meta else None
    return ModelSpec(meta["model"], model.sample_rate, model.num_samples, len(model.labels), depth)


def latencies(
    engines: Mapping[str, Callable[[np.ndarray], object]], windows: np.ndarray, repeats: int
) -> dict[str, list[float]]:
    """Seconds per call of each engine on one window, the engines taking turns in blocks of BLOCK windows."""
    for predict in engines.values():  # warm-up: allocations, kernel selection
        for window in windows[:20]:
            predict(window[None])
    times: dict[str, list[float]] = {name: [] for name in engines}
    for first in range(0, repeats, BLOCK):
        block = range(first, min(first + BLOCK, repeats))
        for name, predict in engines.items():
            for i in block:
                window = windows[i % len(windows)][None]
                start = time.perf_counter()
                predict(window)
                times[name].append(time.perf_counter() - start)
    return times


@dataclass(frozen=True)
class _Pair:
    """The model as two graphs, and the one file they lie beside."""

    model: PairedModel
    path: Path


def _pair_of(model_path: Path, model: Any, spec: ModelSpec, labels: list[str], out: Path) -> _Pair:
    """The model's two graphs: those beside its file (as `fedspeech listen --model` takes them), else
    exported into out from the torch model rebuilt from it.
    """
    from fedspeech.export.onnx_export import export_onnx

    local = load_local(model_path)
    if isinstance(local, PairedModel):
        return _Pair(local, model_path)
    path = export_onnx(model, spec, labels, out / "model.onnx", pair=True)
    paired = load_local(path)
    if not isinstance(paired, PairedModel):
        raise BenchError(f"{model_path}: its two graphs, exported afresh, are not the same model")
    return _Pair(paired, path)


def hop_of(pair: _Pair | PairedModel, hop_ms: float = DetectorConfig().hop_ms) -> Callable[[np.ndarray], Any]:
    """A pair's work for one window of a stream, one hop after the last: the front-end on the samples of
    the hop's new frames, the window's frames copied (as the detector's ring does), the classifier.
    """
    model = pair.model if isinstance(pair, _Pair) else pair
    new = max(1, min(model.frames, round(model.sample_rate * hop_ms / 1000) // model.hop_samples))
    length = (new - 1) * model.hop_samples + model.fft_samples
    frames = np.zeros((1, model.n_mels, model.frames), np.float32)
    window_frames = np.zeros_like(frames)

    def one_hop(window: np.ndarray) -> np.ndarray:
        features = model.features(np.ascontiguousarray(window[:, window.shape[1] - length :]))
        frames[:, :, -new:] = features
        window_frames[:] = frames  # the ring's copy into the window, oldest frame first
        return model.classify(window_frames)

    return one_hop


def _matmul_gflops(seconds: float = 0.5, size: int = 256) -> float:
    """Single-thread float32 matrix-multiply rate of this core now (torch with one thread)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    torch.mm(a, b, out=out)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b, out=out)
        calls += 1
    return calls * 2 * size**3 / (time.perf_counter() - start) / 1e9


def _speech_file(clips: list, sample_rate: int, path: Path) -> float:
    """Write the clips, each followed by GAP_S of silence, as one mono WAV; return its seconds."""
    from fedspeech.runtime.audio_file import read_audio

    gap = np.zeros(int(GAP_S * sample_rate), np.float32)
    audio = np.concatenate(
        [gap, *[part for clip in clips for part in (read_audio(clip.path, sample_rate), gap)]]
    )
    soundfile.write(path, audio, sample_rate)
    return len(audio) / sample_rate


def _one_per_label(clips: list) -> list:
    """The first clip of each label, in label order: one held-out speaker saying every word once."""
    first: dict[int, Any] = {}
    for clip in clips:
        first.setdefault(clip.label, clip)
    return [first[label] for label in sorted(first)]


def _listen_process(model: Path, audio: Path, labels: list[str]) -> tuple[float, float, float, int]:
    """Run `fedspeech listen` at real speed: CPU share of one core in all and once started (from SETTLE_S
    on: the interpreter's start and the imports are paid once), peak RSS (MB), detections printed.
    """
    import psutil

    # Peak RSS is sampled, not read from getrusage: a child's recorded maximum includes the moment
    # between fork and exec, when it is still a copy of this process, torch and all.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    args = [sys.executable, "-m", "fedspeech", "listen", "--model", str(model), "--input", str(audio)]
    proc = subprocess.Popen(
        [*args, "--realtime"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    watched, peak = psutil.Process(proc.pid), 0
    settled: tuple[float, float] | None = None  # (wall, CPU seconds) at SETTLE_S
    last: tuple[float, float] | None = None  # the last sample before it exited
    while proc.poll() is None:
        try:
            if "listen" in watched.cmdline():  # exec'd: no longer a copy of this process
                peak = max(peak, watched.memory_info().rss)
                times, now = watched.cpu_times(), time.perf_counter()
                last = (now, times.user + times.system)
                if settled is None and now - start >= SETTLE_S:
                    settled = last
        except psutil.Error:
            pass  # it has just exited
        time.sleep(0.01)
    wall = time.perf_counter() - start
    output, _ = proc.communicate()
    if proc.returncode != 0:
        raise BenchError(f"`fedspeech listen --model {model}` failed with exit code {proc.returncode}")
    if settled is None or last is None or last[0] - settled[0] < 1.0:
        raise BenchError(f"`fedspeech listen` ran {wall:.1f} s, too short to measure it once started")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    steady = (last[1] - settled[1]) / (last[0] - settled[0])
    detections = sum(_is_detection(line, labels) for line in output.splitlines())
    return cpu / wall, steady, peak / 2**20, detections


def _is_detection(line: str, labels: list[str]) -> bool:
    return any(token in labels for token in line.split())


def _cold_start(model: Path, audio: Path, labels: list[str]) -> float:
    """Seconds from starting `fedspeech listen` on a file (as fast as possible) to its first detection."""
    start = time.perf_counter()
    args = [sys.executable, "-m", "fedspeech", "listen", "--model", str(model), "--input", str(audio)]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        for line in proc.stdout or ():
            if _is_detection(line, labels):
                elapsed = time.perf_counter() - start
                proc.kill()
                return elapsed
    raise BenchError(
        f"`fedspeech listen` heard no word in held-out speech with {model}, so cold start to the first "
        "detection cannot be timed: give a trained model (`fedspeech demo` writes one)"
    )


def run_inference_bench(
    model_path: Path, out: Path, data_dir: Path | None = None, repeats: int = 500
) -> Path:
    """Measure the exported model at model_path; write results.md and results.json into out.

    BenchError if the model is not one, its corpus is not there, or the listener hears nothing.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fedspeech.export.onnx_export import PREFIX
    from fedspeech.models import build_model
    from fedspeech.models.clips.datasets import (
        client_clips,
        load_corpus,
        load_waveforms,
        server_test_clips,
        speakers,
    )
    from fedspeech.models.train import set_arrays

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    try:
        fp32 = load_model(model_path)
    except ModelError as exc:
        raise BenchError(str(exc)) from None
    try:
        spec = spec_of(fp32)
    except (KeyError, ValueError) as exc:
        raise BenchError(f"{model_path}: not a model fedspeech exported (its metadata: {exc})") from None
    model = build_model(spec).eval()
    set_arrays(model, initializers(onnx.load(model_path), PREFIX))
    try:
        corpus = load_corpus(fp32.metadata.get("task") or "fsdd", data_dir)
    except (ValueError, FileNotFoundError) as exc:
        raise BenchError(f"the model's held-out clips: {exc}") from None
    heldout_clips = server_test_clips(corpus)
    heldout, labels = load_waveforms(heldout_clips, spec.sample_rate, spec.num_samples)
    train = [c for s in speakers(corpus) for c in client_clips(corpus, s)[0]]
    pick = np.random.default_rng(0).choice(len(train), min(300, len(train)), replace=False)
    calibration, _ = load_waveforms([train[i] for i in pick], spec.sample_rate, spec.num_samples)

    logging.getLogger().addFilter(_not_advice)
    try:
        int8_path = quantize(model_path, out / "model-int8.onnx", calibration)
    finally:
        logging.getLogger().removeFilter(_not_advice)
    int8 = OnnxModel(int8_path)

    @torch.no_grad()
    def eager(window: np.ndarray) -> np.ndarray:
        return torch.softmax(model(torch.from_numpy(window)), dim=-1).numpy()

    pair = _pair_of(model_path, model, spec, fp32.labels, out)
    engines = {"onnx fp32": fp32.predict, PAIR_ENGINE: hop_of(pair), "onnx int8": int8.predict}
    engines["torch eager"] = eager
    times = latencies(engines, heldout, repeats)
    sizes = {"onnx fp32": model_path.stat().st_size, "onnx int8": int8_path.stat().st_size}
    sizes[PAIR_ENGINE] = sum(path.stat().st_size for path in meta.pair_paths(pair.path))
    whole = {**engines, PAIR_ENGINE: pair.model.predict}  # accuracy: the pair on whole windows
    rows = [
        Engine(
            name,
            float(np.median(times[name]) * 1e3),
            float(np.percentile(times[name], 95) * 1e3),
            float(np.mean(predict(heldout).argmax(axis=1) == labels)),
            sizes.get(name),
        )
        for name, predict in whole.items()
    ]
    with FlopCounterMode(display=False) as counter:
        eager(heldout[:1])
    flops = counter.get_total_flops()
    gflops = _matmul_gflops()

    with tempfile.TemporaryDirectory() as tmp:
        speaker = heldout_clips[-1].speaker
        words = _one_per_label([c for c in heldout_clips if c.speaker == speaker])
        audio = Path(tmp) / "words.wav"
        seconds = _speech_file(words, spec.sample_rate, audio)
        cold = _cold_start(model_path, audio, fp32.labels)  # first: a model that hears nothing fails fast
        share, steady, rss, detections = _listen_process(model_path, audio, fp32.labels)

    report = InferenceReport(
        model=f"{spec.name} ({model_path})",
        engines=rows,
        mflop_per_window=flops / 1e6,
        matmul_gflops=gflops,
        floor_ms=flops / (gflops * 1e9) * 1e3,
        listen_cpu_share=share,
        listen_steady_share=steady,
        listen_peak_rss_mb=rss,
        listen_audio_s=seconds,
        listen_detections=detections,
        cold_start_s=cold,
    )
    (out / "results.json").write_text(json.dumps(asdict(report), indent=2))
    path = out / "results.md"
    path.write_text(report.markdown())
    print(report.markdown())
    print(f"wrote {path}, {out / 'results.json'} and {int8_path}")
    return path
