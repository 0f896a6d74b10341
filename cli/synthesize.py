"""`fedspeech synthesize`: a task's words spoken by the machine's speech synthesizers, into a data folder."""

import argparse
import logging
from pathlib import Path

log = logging.getLogger("fedspeech.synthesize")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `fedspeech synthesize` to the command line."""
    from fedspeech.models.clips.synthetic import DEFAULT_TAKES, MAX_TAKES

    s = sub.add_parser(
        "synthesize",
        help="speak a task's words with every voice of the machine's synthesizers, into a data folder",
    )
    s.add_argument("--task", required=True, help="a task file, or a built-in task (fsdd, speech_commands)")
    s.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new or empty folder to fill")
    s.add_argument(
        "--takes", type=int, default=DEFAULT_TAKES,
        help=f"takes of each word, spread over the voices (default {DEFAULT_TAKES}, at most {MAX_TAKES})",
    )  # fmt: skip
    s.add_argument("--seed", type=int, default=0, help="which settings are drawn (default 0)")
    s.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Synthesize the task's words into --out, with its SOURCE.md; one line for a task it cannot do."""
    from fedspeech.models.clips.progress import progress_logger
    from fedspeech.models.clips.synthetic import SynthesisRefused, synthesize
    from fedspeech.models.clips.tasks import TaskFileError, load_task

    try:
        definition = load_task(args.task)
    except TaskFileError as exc:
        raise SystemExit(f"fedspeech synthesize: {exc}") from None
    out: Path = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SystemExit(f"fedspeech synthesize: {out} exists and is not an empty folder")
    try:
        summary = synthesize(definition, out, args.takes, args.seed, progress=progress_logger("takes", log))
    except SynthesisRefused as exc:
        raise SystemExit(f"fedspeech synthesize: {exc}") from None
    counts = ", ".join(f"{label} {n}" for label, n in summary.takes.items())
    total = sum(summary.takes.values())
    print(f"{total} takes in {out} ({counts}), by {len(summary.voices)} voices; see {out / 'SOURCE.md'}")
