"""Made-up benchmark runs, for the tests of the benchmarks' reports."""

from fedspeech.coordinator.state.records import RoundRecord
from fedspeech_bench.runs import Run


def made_up_run(
    corpus: str,
    arm: str,
    seed: int,
    accuracies: list[float],
    round_s: float = 10.0,
    mb_per_round: float = 0.002,
) -> Run:
    """A benchmark run with these accuracies, one round every round_s seconds moving mb_per_round MB."""
    rounds = [
        RoundRecord(
            round=i + 1,
            started_at=100.0 + i * round_s,
            finished_at=100.0 + (i + 1) * round_s,
            wall_s=round_s,
            devices=3,
            results=3,
            accuracy=acc,
            macro_f1=acc,
            loss=1.0,
            bytes_up=int(mb_per_round * 1e6 / 2),
            bytes_down=int(mb_per_round * 1e6 / 2),
            weights_sha256="00",
        )
        for i, acc in enumerate(accuracies)
    ]
    return Run(corpus, arm, seed, rounds, t0=100.0)
