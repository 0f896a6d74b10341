"""`fedspeech bench dashboard`: round wall time with dashboards polling against none, in one run.

Blocks of rounds alternate between the two arms, so that drift in the machine's load falls on both alike.
"""

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

SPEAKERS = ("george", "jackson", "theo")
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BLOCK = 3  # rounds in a row with the same number of dashboards open


def chromium(width: int = 1280, height: int = 900) -> Any:
    """Headless Chromium (Debian's) driven through its own chromedriver; RuntimeError if it is missing."""
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        raise RuntimeError("needs Chromium and its driver: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # the flags keep a headless browser off the network beyond the page it is given
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(flag)
    try:
        # at the lowest priority: it stands for a browser on the operator's own machine, so that what is
        # measured is the coordinator's work in answering it, not the page's rendering on this machine's cores
        service = webdriver.ChromeService(CHROMEDRIVER, popen_kw={"preexec_fn": lambda: os.nice(19)})
        return webdriver.Chrome(options=options, service=service)
    except WebDriverException as exc:
        raise RuntimeError(f"Chromium did not start: {exc.msg}") from None


def shown_round(driver: Any) -> int | None:
    """The completed round the dashboard in the driver's current window shows, if any."""
    value = driver.execute_script("return document.body ? document.body.dataset.completedRound : null")
    return int(value) if value else None


def _wait_for_round(driver: Any, round: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while shown_round(driver) != round:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the dashboard did not show round {round} within {timeout_s:.0f} s")
        time.sleep(0.2)


def _polled(round: int) -> bool:
    """Whether dashboards poll during a round: blocks of BLOCK rounds alternate, from round 2."""
    return round >= 2 and (round - 2) // BLOCK % 2 == 1


def _measured(round: int) -> bool:
    """Rounds 0 and 1 start the devices, and each block's first round absorbs the pages opening or closing."""
    return round >= 2 and (round - 2) % BLOCK != 0


def run_dashboard_bench(out: Path, rounds: int, tabs: int, max_samples: int) -> Path:
    """Run the fleet with `tabs` dashboards polling in every other block of rounds; the report's path."""
    from fedspeech_bench.fleet_run import fleet_config, fleet_run
    from fedspeech_bench.fleets.fleet_files import DeviceSpec

    out.mkdir(parents=True, exist_ok=True)
    fleet = [DeviceSpec(s, s, cpu_share=1.0) for s in SPEAKERS]
    run_dir = out / "run"
    config = fleet_config(fleet, "fsdd", run_dir).changed(rounds=rounds, eval_limit=100)
    arms = {False: "none", True: f"{tabs} dashboards"}
    walls: dict[str, list[tuple[int, float]]] = {arm: [] for arm in arms.values()}
    driver = chromium(1280, 1500)  # tall enough for the screenshot to show the rounds too
    try:
        for _ in range(tabs - 1):
            driver.switch_to.new_window("window")  # windows, not background tabs: no timer throttling
        windows = driver.window_handles
        device_args = ["--max-samples", str(max_samples)]
        with fleet_run(fleet, "fsdd", run_dir, config, device_args=device_args) as run:
            store, seen, open_ = run.service.store, 0, False
            while not run.service.orchestrator.finished.is_set():
                latest = store.latest_round()
                if latest is not None and latest.round > seen:
                    seen = latest.round
                    if _measured(seen):
                        walls[arms[_polled(seen)]].append((seen, latest.wall_s))
                    if _polled(seen + 1) != open_:
                        open_ = not open_
                        for window in windows:
                            driver.switch_to.window(window)
                            if not open_ and shown_round(driver) is None:
                                raise RuntimeError("a dashboard did not render while it was open")
                            driver.get(run.url + "/" if open_ else "about:blank")
                    print(
                        f"round {seen} of {rounds}: {latest.wall_s:.2f} s, {arms[_polled(seen)]}", flush=True
                    )
                time.sleep(0.05)
            run.wait(60)
            driver.switch_to.window(windows[0])
            driver.get(run.url + "/")
            _wait_for_round(driver, rounds)
            driver.save_screenshot(str(out / "dashboard.png"))
    finally:
        driver.quit()
    report = _report(walls, out)
    (out / "report.md").write_text(report)
    print(report)
    return out / "report.md"


def _report(walls: dict[str, list[tuple[int, float]]], out: Path) -> str:
    """A markdown table of each arm's round wall times, and a plot of every round's."""
    from fedspeech_bench.report.plots import pyplot
    from fedspeech_bench.report.summaries import welch

    plt = pyplot()

    none = [w for _, w in walls["none"]]
    base = statistics.mean(none)
    lines = [
        "| dashboards polling | rounds | mean s | median s | stdev s | mean / none | p (Welch) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, rows in walls.items():
        seconds = [w for _, w in rows]
        p = "-" if arm == "none" else f"{welch(none, seconds)[0]:.3f}"
        lines.append(
            f"| {arm} | {len(seconds)} | {statistics.mean(seconds):.3f} | {statistics.median(seconds):.3f} | "
            f"{statistics.stdev(seconds):.3f} | {statistics.mean(seconds) / base:.3f} | "
            f"{p} |"
        )
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for arm, rows in walls.items():
        ax.plot([r for r, _ in rows], [w for _, w in rows], "o", label=arm)
    ax.set_xlabel("round")
    ax.set_ylabel("wall time (s)")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.savefig(out / "round_wall_time.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return "\n".join(lines) + "\n\n![round wall time](round_wall_time.png)\n"


def add_parser(bench: argparse._SubParsersAction) -> None:
    """Add `bench dashboard` to the command line."""
    b = bench.add_parser("dashboard", help="round wall time with dashboards polling against none")
    b.add_argument("--out", type=Path, default=Path("fedspeech-bench-dashboard"), help="where results go")
    b.add_argument("--rounds", type=int, default=62, help=f"rounds in all, in blocks of {BLOCK} (default 62)")
    b.add_argument("--tabs", type=int, default=3, help="browser windows polling the dashboard (default 3)")
    b.add_argument("--max-samples", type=int, default=200, help="clips each device trains on per round")
    b.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> None:
    if args.rounds < 5 or args.tabs < 1 or args.max_samples < 1:
        raise SystemExit(
            "fedspeech bench dashboard: --rounds at least 5, --tabs and --max-samples at least 1"
        )
    try:
        run_dashboard_bench(args.out, args.rounds, args.tabs, args.max_samples)
    except RuntimeError as exc:
        raise SystemExit(f"fedspeech bench dashboard: {exc}") from None
