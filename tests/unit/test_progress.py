"""Progress lines of the long commands: the time-left maths, the lines, and how the benches use them."""

import io
import json
import logging
from dataclasses import asdict

import numpy as np
import pytest

from fedspeech.coordinator.state.records import RoundRecord
from fedspeech.models.clips.datasets import bundled_data_dir
from fedspeech.models.clips.tasks import BACKGROUND_NOISE
from fedspeech_bench import harness as bench
from fedspeech_bench import seeds as bench_seeds
from fedspeech_bench.demo import round_printer
from fedspeech_bench.listen_bench import ListenBenchConfig, condition_count, conditions
from fedspeech_bench.listen_streams import Stream, Word
from fedspeech_bench.run_progress import CLEAR_LINE, Progress, duration_text, eta_s, progress_line
from fedspeech_bench.splits import Setting
from tests.helpers.bench_runs import made_up_run


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (-3, "0s"), (44.6, "45s"), (59.4, "59s"), (60, "1m00s"), (185, "3m05s"), (3599, "59m59s")]
    + [(3600, "1h00m"), (7620, "2h07m"), (100 * 3600 + 59, "100h00m")],
)
def test_durations_read_as_seconds_minutes_or_hours(seconds, text):
    assert duration_text(seconds) == text


def test_nothing_to_go_by_gives_no_time_left():
    assert eta_s([], 3, rounds=20) is None
    assert eta_s([], 3, rounds=20, round_ends=[70.0], elapsed_s=75.0) is None  # start-up is no pace
    assert eta_s([], 3) is None  # runs without rounds, none finished


def test_the_first_run_is_paced_by_its_rounds_after_its_start_up():
    # 60 s of start-up to the end of round 1, then 10 s a round: 3 rounds done at 80 s
    left = eta_s([], 2, rounds=20, round_ends=[60.0, 70.0, 80.0], elapsed_s=80.0)
    assert left == pytest.approx(17 * 10 + 2 * (60 + 19 * 10))
    # half-way through the next round, it is that much nearer
    assert eta_s([], 2, 20, [60.0, 70.0, 80.0], 85.0) == pytest.approx(left - 5)


def test_runs_to_come_take_as_long_as_the_finished_runs_did():
    # two finished runs of 200 and 300 s; the current one at 10 s a round, 4 of 20 rounds done
    left = eta_s([200.0, 300.0], 5, rounds=20, round_ends=[30.0, 40.0, 50.0, 60.0], elapsed_s=60.0)
    assert left == pytest.approx(16 * 10 + 5 * 250)
    assert eta_s([200.0, 300.0], 5, rounds=20) == pytest.approx(5 * 250)  # between runs
    # a run already slower than the others has nothing left, never less than nothing
    assert eta_s([100.0], 2, elapsed_s=130.0) == pytest.approx(2 * 100)
    assert eta_s([100.0], 2, elapsed_s=30.0) == pytest.approx(70 + 2 * 100)


def test_a_progress_line_names_the_run_the_round_and_the_time():
    line = progress_line(3, 40, "fsdd fedavg seed 0", 12, 20, 1265, 3 * 3600 + 12 * 60)
    assert line == "run 3/40 (fsdd fedavg seed 0): round 12/20, 21m05s elapsed, about 3h12m left"
    assert progress_line(1, 2, "", 0, 20, 4, None) == "run 1/2: round 0/20, 4s elapsed"
    assert progress_line(2, 3, "emodb central seed 1", 0, None, 65, 130) == (
        "run 2/3 (emodb central seed 1): 1m05s elapsed, about 2m10s left"
    )


def test_piped_it_prints_a_line_per_change_and_none_per_poll():
    clock, out = Clock(), io.StringIO()
    progress = Progress(2, 3, stream=out, clock=clock)
    assert not progress.tty  # a StringIO is no terminal
    progress.start_run("a")
    clock.now += 40
    for polled in (0, 1, 1, 1):  # round 0 (the initial model) and repeats change nothing
        progress.round_done(polled)
    clock.now += 10
    progress.round_done(2)
    clock.now += 10
    progress.round_done(3)
    progress.end_run()
    progress.start_run("b")
    lines = out.getvalue().splitlines()
    assert lines == [
        "run 1/2 (a): round 0/3, 0s elapsed",
        "run 1/2 (a): round 1/3, 40s elapsed",
        "run 1/2 (a): round 2/3, 50s elapsed, about 1m10s left",  # 10 s to go, then 40 + 2 x 10
        "run 1/2 (a): round 3/3, 1m00s elapsed, about 1m00s left",
        "run 2/2 (b): round 0/3, 1m00s elapsed, about 1m00s left",  # as long as run a took
    ]


def test_skipped_and_failed_runs_do_not_set_the_pace():
    clock, out = Clock(), io.StringIO()
    progress = Progress(4, 2, stream=out, clock=clock)
    progress.skip_run()  # read back from disk: no line, no time
    progress.start_run("fails")
    clock.now += 500
    progress.round_done(1)
    progress.end_run()  # after 1 of 2 rounds
    assert progress.finished == []
    progress.start_run("works")
    clock.now += 30
    progress.round_done(1)
    clock.now += 10
    progress.round_done(2)
    progress.end_run()
    assert progress.finished == [40.0]
    assert out.getvalue().splitlines()[-1] == "run 3/4 (works): round 2/2, 9m00s elapsed, about 40s left"
    progress.start_run("last")
    assert out.getvalue().splitlines()[-1] == "run 4/4 (last): round 0/2, 9m00s elapsed, about 40s left"


def test_on_a_terminal_the_line_is_redrawn_and_results_print_above_it(capsys):
    clock, err = Clock(), io.StringIO()
    with Progress(1, 2, stream=err, tty=True, clock=clock) as progress:
        progress.start_run("a")
        clock.now += 5
        progress.round_done(1)
        progress.say("a result")
    assert err.getvalue() == (
        f"{CLEAR_LINE}run 1/1 (a): round 0/2, 0s elapsed"
        f"{CLEAR_LINE}run 1/1 (a): round 1/2, 5s elapsed"
        f"{CLEAR_LINE}"  # cleared before the result line, then drawn again below it
        f"{CLEAR_LINE}run 1/1 (a): round 1/2, 5s elapsed"
        "\n"  # ended when done, so what follows starts on its own line
    )
    assert capsys.readouterr().out == "a result\n"


def test_the_demo_line_counts_rounds_of_the_total_and_paces_them_after_round_one(capsys):
    def record(n: int, finished_at: float) -> RoundRecord:
        return RoundRecord(n, finished_at - 5, finished_at, 5.0, 6, 6, 0.5, 0.5, 1.0, 10**6, 10**6, "00")

    show = round_printer(rounds=10, t0=0.0)
    for n, finished_at in [(0, 20.0), (1, 80.0), (2, 90.0), (3, 100.0)]:
        show(record(n, finished_at))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["0/10", "1/10", "2/10", "3/10"]
    assert "left" not in lines[0] and "left" not in lines[1]
    assert "(total  100.0 s, about 1m10s left)" in lines[3]  # 7 rounds at 10 s


def test_a_bench_shows_each_run_and_round_and_prints_its_results(monkeypatch, tmp_path, capsys):
    def fake_run_once(cfg, corpus, arm, seed, on_round):
        for n in range(cfg.rounds + 1):
            on_round(n)
        return made_up_run(corpus, arm.name, seed, [0.5] * cfg.rounds)

    monkeypatch.setattr(bench, "run_once", fake_run_once)
    cfg = bench.strategies_config(tmp_path, ["fedavg", "epochs_only"], corpora=["fsdd"], seeds=2, rounds=3)
    runs = bench.run_all(cfg)
    assert [(r.arm, r.seed) for r in runs["fsdd"]] == [
        ("fedavg", 0),
        ("epochs_only", 0),
        ("fedavg", 1),
        ("epochs_only", 1),
    ]
    out, err = capsys.readouterr()
    assert out.count("accuracy 0.5000") == 4
    lines = err.splitlines()
    assert len(lines) == 4 * (1 + 3)  # the start and every round of every run
    assert lines[0].startswith("run 1/4 (fsdd fedavg seed 0): round 0/3")
    assert lines[-1].startswith("run 4/4 (fsdd epochs_only seed 1): round 3/3")


def test_bench_seeds_reads_back_finished_runs_and_keeps_going_after_a_failure(monkeypatch, tmp_path, capsys):
    cfg = bench_seeds.SeedsConfig(tmp_path, splits=["fsdd-within"], arms=["fedavg", "fedprox"], rounds=2)
    setting = Setting("fsdd-within", "fsdd-within", "fsdd", [], {}, tmp_path / "validation")
    done = tmp_path / "completed" / "fsdd-within-fedavg-0.json"
    done.parent.mkdir()
    done.write_text(json.dumps(asdict(made_up_run("fsdd-within", "fedavg", 0, [0.4, 0.6]))))

    def failing(*args, **kwargs):
        raise RuntimeError("a device process exited early")

    monkeypatch.setattr(bench_seeds, "train_run", failing)
    failures: list[str] = []
    progress = Progress(2, 2)
    read_back = bench_seeds._run(cfg, setting, "fedavg", 0, progress, failures)
    assert read_back is not None and read_back.final_accuracy == 0.6
    assert bench_seeds._run(cfg, setting, "fedprox", 0, progress, failures) is None
    assert failures == ["fsdd-within fedprox seed 0: a device process exited early"]
    out, err = capsys.readouterr()
    assert "fsdd-within fedavg       seed 0: accuracy 0.6000" in out
    assert err.splitlines()[0] == "run 2/2 (fsdd-within fedprox seed 0): round 0/2, 0s elapsed"
    assert "RuntimeError: a device process exited early" in err


@pytest.mark.parametrize(("real", "talk"), [(False, False), (True, False), (True, True)])
def test_bench_listen_counts_its_conditions_as_it_makes_them(real, talk):
    rate = 8000
    audio = np.zeros(rate, dtype=np.float32)
    audio[2000:4000] = 0.05
    stream = Stream(audio, rate, [Word("1", 2000, 4000)])
    noise = sorted((bundled_data_dir() / BACKGROUND_NOISE).glob("*.flac"))[:2]
    assert len(noise) == 2
    cfg = ListenBenchConfig(models={}, noise_minutes=0.01, talk_minutes=0.01)
    # one level, own, brisk; the noise clips stand in for talk
    made = conditions(stream, stream, stream, cfg, noise if real else None, noise if talk else None)
    assert len(made) == condition_count(real, talk)


def test_a_long_jobs_lines_come_every_few_seconds_with_the_time_left_and_one_at_the_end(monkeypatch, caplog):
    from fedspeech.models.clips import progress

    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    report = progress.progress_logger("takes", logging.getLogger("job"), every_s=5.0)
    with caplog.at_level(logging.INFO, "job"):
        for done in range(1, 11):
            now[0] += 1.0  # a take a second
            report(done, 10)
    # none from the first take alone; at 5 s, 5 to go at a second each; then the end
    assert [r.message for r in caplog.records] == ["takes: 5 of 10, about 5 s left", "takes: 10 of 10, done"]
