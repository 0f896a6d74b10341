"""The benchmarks' results files: results.md and results.json, with the plots beside them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedspeech_bench.bench_config import DEFAULT_TARGETS, BenchConfig, Results, SeedsConfig
from fedspeech_bench.report.plots import plot_loso, plot_rounds, write_plots
from fedspeech_bench.report.summaries import mean_std, summarize
from fedspeech_bench.report.tables import (
    BASELINE,
    loso_goal,
    loso_table,
    markdown_table,
    personalised_line,
    skewed_goal,
    table2,
)
from fedspeech_bench.splits import SPLIT_CORPUS, label_counts_table

if TYPE_CHECKING:
    from fedspeech_bench.runs import Run
    from fedspeech_bench.splits import Setting, SkewedDeal

# Targets for rounds and time to target, beside each corpus' (DEFAULT_TARGETS, which the within-speaker
# splits use): LOSO uses EmoDB's (the same task, the same bar); the skewed fleet the 0.82 FedAvg needed
# 21 rounds for in the issue that asked for this bench.
LOSO_TARGET = 0.5
SKEWED_TARGET = 0.82


def target_of(split: str) -> float:
    """The accuracy whose rounds and time to reach are reported for a split."""
    if split == "emodb-loso":
        return LOSO_TARGET
    if split == "speech-commands-skewed":
        return SKEWED_TARGET
    return DEFAULT_TARGETS[SPLIT_CORPUS[split]]


def write_seeds_results(
    cfg: SeedsConfig, settings: Mapping[str, list[Setting]], deal: SkewedDeal | None, results: Results
) -> Path:
    """results.md (a table per split, LOSO per speaker, Table 2, the goals), results.json and PNGs."""
    report = [
        "# fedspeech seed-methods benchmark",
        "",
        f"{cfg.seeds} seeds x {cfg.rounds} rounds; arms: {', '.join(cfg.arms)}; baseline {BASELINE}.",
        "",
    ]
    data: dict[str, Any] = {}
    for split in cfg.splits:
        runs = results.runs[split]
        if not runs:
            report += [f"### {split}: no completed runs", ""]
            continue
        target = target_of(split)
        rows = summarize(runs, target, BASELINE)
        fleet = settings[split][0].fleet
        described = f"{len(fleet)} devices" + (
            f", one speaker held out per fold ({len(settings[split])} folds; a run per fold and seed)"
            if split == "emodb-loso"
            else ""
        )
        report.append(markdown_table(split, rows, target, described, BASELINE))
        if split == "emodb-loso":
            report += [
                loso_table(runs),
                loso_goal(runs),
                f"![emodb-loso-speakers]({plot_loso(runs, cfg.out).name})",
            ]
        else:
            report += [f"![{p.stem}]({p.name})" for p in write_plots(split, runs, rows, cfg.out)]
        if split == "speech-commands-skewed" and deal is not None:
            report += [
                "",
                "Clips per device and label (rule: splits.skewed_deal):",
                "",
                label_counts_table(deal),
            ]
            if results.central:
                accuracy = [c.accuracy for c in results.central]
                report += [
                    f"Centralized training of the same CNN on the pooled training clips, "
                    f"{results.central[0].epochs} epochs: accuracy "
                    f"{mean_std(accuracy)} over {len(accuracy)} seeds.",
                    "",
                    skewed_goal(runs, accuracy),
                ]
        report += [
            personalised_line(runs),
            table2(split, rows, target),
            f"![{split}-rounds]({plot_rounds(split, runs, cfg.out).name})",
            "",
        ]
        data[split] = {"summaries": [asdict(r) for r in rows], "runs": [asdict(r) for r in runs]}
    if results.failures:
        report += ["### Failed runs", "", *(f"- {failure}" for failure in results.failures), ""]
    data["central"] = [asdict(c) for c in results.central]
    data["failures"] = results.failures
    (cfg.out / "results.json").write_text(json.dumps(data, indent=2))
    path = cfg.out / "results.md"
    path.write_text("\n".join(report))
    print(f"wrote {path}, {cfg.out / 'results.json'} and the plots beside them")
    return path


def write_results(cfg: BenchConfig, by_corpus: Mapping[str, list[Run]]) -> Path:
    """results.md (a table and plots per corpus) and results.json of bench strategies, growing, poisoning."""
    report = [f"# {cfg.title}", ""]
    results = {}
    for corpus, runs in by_corpus.items():
        target = cfg.targets[corpus]
        rows = summarize(runs, target, cfg.baseline)
        results[corpus] = {"summaries": [asdict(r) for r in rows], "runs": [asdict(r) for r in runs]}
        fleet = cfg.fleet(corpus)
        fleet_name = f"{len(fleet)} processes, {sum(len(d.device_ids) for d in fleet)} devices"
        report.append(markdown_table(corpus, rows, target, fleet_name, cfg.baseline))
        report += [f"![{p.stem}]({p.name})" for p in write_plots(corpus, runs, rows, cfg.out)] + [""]
    (cfg.out / "results.json").write_text(json.dumps(results, indent=2))
    path = cfg.out / "results.md"
    path.write_text("\n".join(report))
    print(f"wrote {path}, {cfg.out / 'results.json'} and the plots beside them")
    return path
