"""`fedspeech bench listen`: how well `fedspeech listen` hears words from speakers it never trained on.

The stream: the test takes of every FSDD speaker (300 clips, never trained on; or ListenBenchConfig.heard,
as `fedspeech bench coldstart --listen` gives the unseen speakers' commands), shuffled with --seed and
joined with --pause-s of silence, with that pause before the first word and after the last, each read as
`fedspeech listen` reads a file, at the model's sample rate, and brought to one level (WORD_RMS): FSDD's
speakers were recorded up to 19 dB apart, and a stream-wide SNR would put the quietest at -9 dB when the
stream is at 10 dB. It is heard clean; in white noise and in real background noise at 20 and 10 dB SNR;
then with every speaker at the level they were recorded at (as people speak in a room), in each noise at
20, 10 and 5 dB SNR over the whole stream, so that the quiet speakers are below it; then brisk, with
0.3 s between words, clean; then in a room whose reverberation time (RT60) is 0.3 and 0.6 s, clean, the
one-level stream convolved with a synthetic impulse response (listen_streams.room_response) and brought
back to its speech power, the words' times those of the dry stream. The SNR is 10 log10(P_speech /
P_noise), P_speech the mean power of the words' samples (pauses excluded) and the noise added over the
whole stream. Then streams where every detection is a false one, reported per hour: --noise-minutes of
white and of real noise alone, each at its level in the 10 dB condition; and --talk-minutes of German
talk, clean, that never says a task word: EmoDB's sentences by 10 actors (DIR/emodb/wav) but for a07, "In
sieben Stunden wird es soweit sein" ("sieben" is seven in German; for the ten commands, those that
listen_streams.TASK_WORD_SENTENCES names), each at the words' level, in a
shuffled order looped to length, with 0.2-0.8 s pauses drawn with --seed.

Real noise is the Speech Commands test set's `_silence_` clips that do not train the models: the odd ones
in sorted name order (the even ones are the bundled data/_background_noise_, which training mixes in),
each brought to one level (those under -60 dBFS, near digital silence, left out), concatenated in a
shuffled order and looped to length. Without --data-dir those conditions and talk are skipped.

Every stream is written as a WAV file, read back as `fedspeech listen --input` reads it and heard by the
Listener it runs on, with the listener's own settings (--threshold overrides its threshold, --no-vad
leaves its energy gate alone); a stream longer than the longest file it reads (MAX_INPUT_SECONDS) is
heard in equal parts, each afresh. The words it detects, in time order, are aligned with the words spoken
(word_alignment): detected in order = hits / words; wrong or extra = substitutions + insertions; misses =
deletions.
"""

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from fedspeech.models.clips.datasets import AudioError, bundled_data_dir, load_corpus, server_test_clips
from fedspeech.models.clips.tasks import BACKGROUND_NOISE
from fedspeech.runtime.audio_file import MAX_INPUT_SECONDS, read_audio
from fedspeech.runtime.listener import Listener
from fedspeech.runtime.session import ModelError, load_model
from fedspeech.runtime.streaming import Detection, DetectorConfig
from fedspeech_bench.demo_defaults import DEMO_MODEL
from fedspeech_bench.listen_report import (
    ConditionScore,
    mean_table,
    plot,
    result_json,
    spoken_json,
    summary,
    table,
)
from fedspeech_bench.listen_streams import (
    Heard,
    Stream,
    at_level,
    build_stream,
    other_word_paths,
    real_noise,
    real_noise_paths,
    reverberant,
    speech_power,
    talk,
    talk_paths,
    white_noise,
    with_noise,
    words_alone,
)
from fedspeech_bench.run_progress import Progress
from fedspeech_bench.word_alignment import align

SNRS_DB = (20.0, 10.0)
OWN_LEVEL_SNRS_DB = (20.0, 10.0, 5.0)  # with every speaker at the level they were recorded at
BRISK_PAUSE_S = 0.3  # the pause between words of brisk speech
REVERB_RT60_S = (0.3, 0.6)  # the rooms' reverberation times
NOISE_ALONE_SNR_DB = 10.0  # noise alone is played at its level in this condition
MAX_MINUTES = 60.0  # of noise alone and of talk
MAX_SEEDS = 10
OTHER_WORDS = "other words alone"


@dataclass(frozen=True)
class ListenBenchConfig:
    """What `bench listen` runs."""

    models: dict[str, Path]  # name -> ONNX file
    out: Path = Path("fedspeech-bench-listen")
    data_dir: Path | None = None  # holds speech_commands_test/_silence_ for real noise; None: skip it
    seed: int = 0
    seeds: int = 1  # each model heard with seeds seed, seed + 1, ...
    pause_s: float = 0.6
    noise_minutes: float = 5.0
    talk_minutes: float = 30.0  # 0: no talk
    threshold: float | None = None  # None: the listener's default
    voice: bool = True  # False: the listener's energy gate without its voice detector (--no-vad)
    words: int | None = None  # the first N words of the shuffled stream; None: all
    keep_audio: bool = False
    command: str = ""  # the command line, for the report
    heard: Heard | None = None  # the words heard; None: FSDD's held-out takes (fsdd_heard)


def fsdd_heard() -> Heard:
    """FSDD's held-out takes of the digits, by speakers the demo's devices train on too (other clips)."""
    corpus = load_corpus("fsdd")
    return Heard(tuple(server_test_clips(corpus)), corpus.labels)


def hear(
    model: Path, stream: Stream, wav: Path, threshold: float | None = None, voice: bool = True
) -> list[Detection]:
    """The words `fedspeech listen --input` detects in the stream, written to wav first (a longer stream
    than it reads, in equal parts: wav's stem -1, -2, ..., each heard afresh).
    """
    rate = stream.sample_rate
    parts = np.array_split(stream.audio, -(-len(stream.audio) // round(MAX_INPUT_SECONDS * rate)))
    detections, start = [], 0
    for n, audio in enumerate(parts, 1):
        path = wav if len(parts) == 1 else wav.with_name(f"{wav.stem}-{n}{wav.suffix}")
        soundfile.write(path, audio, rate, subtype="FLOAT")  # no clipping, no rounding
        listener = Listener(model, config=DetectorConfig(threshold=threshold, voice=voice))  # None: its own
        heard = listener.feed(read_audio(path, rate)) + listener.flush()
        detections += [replace(d, time_s=d.time_s + start / rate) for d in heard]
        start += len(audio)
    return detections


def score(condition: str, stream: Stream, detections: list[Detection], seconds: float) -> ConditionScore:
    """Align the detections, in time order, with the words spoken."""
    detected = [d.label for d in sorted(detections, key=lambda d: d.time_s)]
    alignment = align([w.label for w in stream.words], detected)
    return ConditionScore(
        condition, len(stream.words), stream.minutes, alignment, detections, seconds, stream.others
    )


def conditions(
    stream: Stream,
    own_level: Stream,
    brisk: Stream,
    cfg: ListenBenchConfig,
    noise_paths: list[Path] | None,
    talk_sources: list[Path] | None,
    other_sources: list[Path] | None = None,
) -> list[tuple[str, Stream]]:
    """Each condition named, with its stream: the words at one level clean and in noise; the same words at
    their speakers' own levels in noise (SNR over the whole stream); brisk speech clean; the words at one
    level in reverberant rooms; noise alone; talk without a task word (none when talk_sources is None);
    other words said alone (none when other_sources is None).
    """
    rate = stream.sample_rate
    alone = round(cfg.noise_minutes * 60 * rate)
    alone_level = speech_power(stream) / 10 ** (NOISE_ALONE_SNR_DB / 10)
    noises: dict[str, Callable[[int, int], np.ndarray]] = {"white": white_noise}  # (length, seed) -> noise
    if noise_paths is not None:
        noises["real"] = lambda length, seed: real_noise(noise_paths, rate, length, seed)
    named = [("clean", stream)]
    for kind, noise in noises.items():
        heard = noise(len(stream.audio), cfg.seed)
        named += [(f"{kind} {snr:g} dB", with_noise(stream, heard, snr)) for snr in SNRS_DB]
    for kind, noise in noises.items():
        heard = noise(len(own_level.audio), cfg.seed)
        named += [
            (f"own level, {kind} {snr:g} dB", with_noise(own_level, heard, snr)) for snr in OWN_LEVEL_SNRS_DB
        ]
    named.append((f"{BRISK_PAUSE_S:g} s gaps, clean", brisk))
    named += [(f"reverb {rt60:g} s", reverberant(stream, rt60, cfg.seed)) for rt60 in REVERB_RT60_S]
    for kind, noise in noises.items():
        alone_noise = at_level(noise(alone, cfg.seed + 1), np.sqrt(alone_level))
        named.append((f"{kind} noise alone", Stream(alone_noise, rate, [])))
    if talk_sources is not None:
        length = round(cfg.talk_minutes * 60 * rate)
        named.append(((cfg.heard or fsdd_heard()).talk, talk(talk_sources, rate, length, cfg.seed)))
    if other_sources is not None:
        named.append((OTHER_WORDS, words_alone(other_sources, rate, cfg.seed)))
    return named


def condition_count(real: bool, talk: bool, others: bool = False) -> int:
    """How many conditions conditions() makes: clean, each noise at each SNR (one level, then the speakers'
    own), brisk speech, each room, each noise alone, talk, and other words alone.
    """
    noises = 2 if real else 1
    rest = 1 + len(REVERB_RT60_S) + int(talk) + int(others)
    return 1 + noises * (len(SNRS_DB) + len(OWN_LEVEL_SNRS_DB) + 1) + rest


def bench_model(
    name: str,
    path: Path,
    cfg: ListenBenchConfig,
    noise_paths: list[Path] | None,
    talk_sources: list[Path] | None,
    audio_dir: Path,
    progress: Progress,
    other_sources: list[Path] | None = None,
) -> tuple[Stream, list[ConditionScore]]:
    """Build the model's stream and hear it in every condition (a run of progress each); a line each."""
    rate = load_model(path).sample_rate
    spoken = cfg.heard or fsdd_heard()
    clips, labels = spoken.clips, spoken.labels
    stream = build_stream(clips, labels, rate, cfg.pause_s, cfg.seed, cfg.words)
    own_level = build_stream(clips, labels, rate, cfg.pause_s, cfg.seed, cfg.words, level=None)
    brisk = build_stream(clips, labels, rate, BRISK_PAUSE_S, cfg.seed, cfg.words)
    results = []
    named = conditions(stream, own_level, brisk, cfg, noise_paths, talk_sources, other_sources)
    for condition, heard in named:
        progress.start_run(f"{name}: {condition}")
        start = time.monotonic()
        wav = audio_dir / f"{name}-{condition.replace(' ', '-').replace(',', '')}.wav"
        result = score(
            condition, heard, hear(path, heard, wav, cfg.threshold, cfg.voice), time.monotonic() - start
        )
        progress.end_run()
        progress.say(f"{name}: {condition}: {summary(result)} ({result.seconds:.1f} s)")
        results.append(result)
    return stream, results


def check_config(cfg: ListenBenchConfig) -> None:
    """ValueError, in one line, for options, models or noise that would only fail later."""
    if not cfg.models:
        raise ValueError("no model to benchmark")
    heard = cfg.heard or fsdd_heard()
    for path in cfg.models.values():
        if not path.is_file():
            raise ValueError(f"no model at {path}: run `fedspeech demo` first or pass --model")
        try:
            labels = load_model(path).labels
        except ModelError as exc:
            raise ValueError(str(exc)) from None
        if not set(heard.labels) <= set(labels):
            words = "FSDD's digits" if cfg.heard is None else f"the words heard, {list(heard.labels)}"
            raise ValueError(f"{path}: its labels {labels} are not {words}")
    if cfg.pause_s < 0:
        raise ValueError(f"--pause-s must not be negative, got {cfg.pause_s}")
    if not 0 < cfg.noise_minutes <= MAX_MINUTES:
        raise ValueError(f"--noise-minutes must be in (0, {MAX_MINUTES:g}], got {cfg.noise_minutes}")
    if not 0 <= cfg.talk_minutes <= MAX_MINUTES:
        raise ValueError(f"--talk-minutes must be in [0, {MAX_MINUTES:g}], got {cfg.talk_minutes}")
    if not 1 <= cfg.seeds <= MAX_SEEDS:
        raise ValueError(f"--seeds must be from 1 to {MAX_SEEDS}, got {cfg.seeds}")
    if cfg.words is not None and cfg.words < 1:
        raise ValueError(f"--words must be at least 1, got {cfg.words}")
    if cfg.data_dir is not None:
        real_noise_paths(cfg.data_dir, bundled_data_dir() / BACKGROUND_NOISE)
        if cfg.talk_minutes > 0:
            talk_paths(cfg.data_dir, heard.labels)


def run_listen_bench(cfg: ListenBenchConfig) -> Path:
    """Hear every model (checked: check_config) in every condition; write results.md, .json and plots."""
    noise_paths, talk_sources, other_sources = None, None, None
    spoken = cfg.heard or fsdd_heard()
    if cfg.data_dir is None:
        print("real-noise conditions skipped: no --data-dir (needs DIR/speech_commands_test/_silence_)")
        if cfg.talk_minutes > 0:
            print(f"{spoken.talk} skipped: no --data-dir (needs DIR/emodb/wav)")
    else:
        noise_paths = real_noise_paths(cfg.data_dir, bundled_data_dir() / BACKGROUND_NOISE)
        talk_sources = talk_paths(cfg.data_dir, spoken.labels) if cfg.talk_minutes > 0 else None
        other_sources = other_word_paths(cfg.data_dir, spoken.labels, spoken.held)
    cfg.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[ConditionScore]] = {}
    report: dict[str, Any] = {"command": cfg.command, "config": _config_json(cfg), "models": {}}
    counted = condition_count(noise_paths is not None, talk_sources is not None, other_sources is not None)
    progress = Progress(len(cfg.models) * cfg.seeds * counted)
    heard: dict[str, Path] = {}  # a run's name -> its model
    with tempfile.TemporaryDirectory() as scratch, progress:
        audio_dir = cfg.out / "audio" if cfg.keep_audio else Path(scratch)
        audio_dir.mkdir(exist_ok=True)
        for model, path in cfg.models.items():
            for seed in range(cfg.seed, cfg.seed + cfg.seeds):
                name = model if cfg.seeds == 1 else f"{model} seed {seed}"
                start = time.monotonic()
                seeded = replace(cfg, seed=seed)
                stream, runs[name] = bench_model(
                    name, path, seeded, noise_paths, talk_sources, audio_dir, progress, other_sources
                )
                seconds = time.monotonic() - start
                progress.say(f"{name}: whole bench in {seconds:.0f} s")
                heard[name] = path
                report["models"][name] = {
                    "path": str(path),
                    "seed": seed,
                    "seconds": seconds,
                    "spoken": spoken_json(stream),
                    "results": [result_json(r) for r in runs[name]],
                }
    plots = plot(runs, cfg.out)
    lines = ["# bench listen", "", f"`{cfg.command}`", ""]
    if noise_paths is None:
        skipped = "Real-noise conditions" + (f" and {spoken.talk}" if cfg.talk_minutes > 0 else "")
        lines += [f"{skipped} skipped: no --data-dir.", ""]
    if len(runs) > 1:
        lines += [mean_table(list(runs.values())), ""]
    for name, path in heard.items():
        lines += [
            table(name, path, runs[name]),
            f"Whole bench: {report['models'][name]['seconds']:.0f} s.",
            "",
        ]
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    results_md = cfg.out / "results.md"
    results_md.write_text("\n".join(lines) + "\n")
    (cfg.out / "results.json").write_text(json.dumps(report, indent=1))
    print(f"results in {results_md}")
    return results_md


def _config_json(cfg: ListenBenchConfig) -> dict[str, Any]:
    """The options, as JSON."""
    fields = asdict(cfg)
    fields["models"] = {name: str(path) for name, path in cfg.models.items()}
    heard = cfg.heard or fsdd_heard()
    fields["heard"] = {"clips": len(heard.clips), "labels": list(heard.labels), "held": sorted(heard.held)}
    return {key: str(value) if isinstance(value, Path) else value for key, value in fields.items()}


def parse_models(values: Sequence[str] | None) -> dict[str, Path]:
    """--model values, PATH or NAME=PATH, as name -> path (a name is the file's stem by default)."""
    models: dict[str, Path] = {}
    for value in values or [str(DEMO_MODEL)]:
        name, path = value.split("=", 1) if "=" in value else (Path(value).stem, value)
        if not (name and path):
            raise ValueError(f"--model {value!r}: expected PATH or NAME=PATH")
        if name in models:
            raise ValueError(f"two models named {name!r}: name them NAME=PATH")
        models[name] = Path(path)
    return models


def run_from_args(args: argparse.Namespace) -> None:
    """`fedspeech bench listen`: check the options, then run."""
    try:
        cfg = ListenBenchConfig(
            models=parse_models(args.model),
            out=args.out,
            data_dir=args.data_dir,
            seed=args.seed,
            seeds=args.seeds,
            pause_s=args.pause_s,
            noise_minutes=args.noise_minutes,
            talk_minutes=args.talk_minutes,
            threshold=args.threshold,
            voice=not args.no_vad,
            words=args.words,
            keep_audio=args.keep_audio,
            command=shlex.join(["fedspeech", *sys.argv[1:]]),
        )
        check_config(cfg)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"fedspeech bench listen: {exc}") from None
    try:
        run_listen_bench(cfg)
    except (ModelError, ValueError, AudioError) as exc:  # a model or stream refused, an unreadable clip
        raise SystemExit(f"fedspeech bench listen: {exc}") from None
