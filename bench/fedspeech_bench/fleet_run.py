"""One training run on one machine: a coordinator with an embedded broker and an emulated device fleet."""

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedspeech.coordinator.app import Service, create_app, serve
from fedspeech.coordinator.config import CoordinatorConfig
from fedspeech.coordinator.state.records import RoundRecord
from fedspeech_bench.fleets.cpu_limits import DeviceProcess
from fedspeech_bench.fleets.fleet_files import DeviceSpec
from fedspeech_bench.fleets.launch import launch_fleet, stop_fleet


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class FleetRun:
    """A running coordinator, its HTTP URL and its device processes."""

    service: Service
    url: str
    devices: list[DeviceProcess]
    log_dir: Path

    def wait(self, stall_s: float, on_round: Callable[[RoundRecord], None] = lambda r: None) -> None:
        """Wait for all rounds, calling on_round for each; fail if a device dies or rounds stall."""
        store, orchestrator = self.service.store, self.service.orchestrator
        seen, progress_at = 0, time.time()
        while True:
            done = orchestrator.finished.is_set()
            settled = [r for r in store.rounds() if r.round <= orchestrator.settled_round]
            for record in settled[seen:]:  # evaluated on the devices, where that was asked for
                on_round(record)
                seen, progress_at = seen + 1, time.time()
            if done:
                return
            if any(d.proc.poll() is not None for d in self.devices):
                raise RuntimeError(f"a device process exited early; see {self.log_dir}")
            if time.time() - progress_at > stall_s:
                raise RuntimeError(f"no round completed for {stall_s:.0f} s; see {self.log_dir}")
            orchestrator.finished.wait(0.5)


def fleet_config(
    fleet: list[DeviceSpec],
    corpus: str,
    run_dir: Path,
    *,
    data_dir: Path | None = None,
    broker_url: str | None = None,
) -> CoordinatorConfig:
    """A coordinator's config for a fleet's run: the corpus' task and held-out set, state under RUN_DIR.

    Enrolment is open: the emulated devices register as they start. Without broker_url, an embedded
    broker on a free port. Rounds start once every device of the fleet is online.
    """
    return CoordinatorConfig().changed(
        state=run_dir / "state",
        broker=broker_url,
        broker_port=free_port(),
        task=corpus,
        eval_corpus=corpus,
        data_dir=data_dir,
        min_devices=sum(len(spec.device_ids) for spec in fleet),
        open_enrolment=True,
    )


@contextmanager
def fleet_run(
    fleet: list[DeviceSpec],
    corpus: str,
    run_dir: Path,
    config: CoordinatorConfig,
    *,
    port: int = 0,
    device_args: list[str] | None = None,
) -> Iterator[FleetRun]:
    """Start a coordinator with config (fleet_config's, varied) and the fleet's devices; stop all at exit.

    The devices read the corpus from the config's data_dir, and keep their tokens and the
    coordinator's key under RUN_DIR/devices.
    """
    app = create_app(config)
    service = app.extensions["fedspeech"]
    service.start()
    server = serve(app, "127.0.0.1", port)
    url = server.url
    devices: list[DeviceProcess] = []
    try:
        log_dir = run_dir / "logs"
        args = ["--state", str(run_dir / "devices"), *(device_args or [])]
        data_dir = config.evaluation.data_dir
        devices = launch_fleet(fleet, url, service.broker_url, corpus, data_dir, log_dir, args)
        yield FleetRun(service, url, devices, log_dir)
    finally:
        stop_fleet(devices)
        server.stop()
        service.stop()


@contextmanager
def attacking_devices(
    attacks: Mapping[str, str], run: FleetRun, corpus: str, run_dir: Path, data_dir: Path | None = None
) -> Iterator[None]:
    """Devices of corpus speakers (speaker -> attack) that train honestly and upload poisoned updates.

    For the poisoning benchmark only: they run as threads of this process, unthrottled, each a device
    daemon whose trainer tampers with its update (fedspeech_bench.fleets.poisoning).
    """
    from fedspeech.edge_client.daemon import ClientConfig, run_client
    from fedspeech.edge_client.local_data import DataSource
    from fedspeech.protocol.mqtt import BrokerSettings
    from fedspeech_bench.fleets.poisoning import attacking_trainer

    stop = threading.Event()
    threads = [
        threading.Thread(
            target=run_client,
            args=(
                ClientConfig(
                    coordinator_url=run.url,
                    broker=BrokerSettings(run.service.broker_url),
                    device_id=speaker,
                    data=DataSource(corpus=corpus, speaker=speaker, corpus_dir=data_dir),
                    state_dir=run_dir / "devices" / speaker,
                    topic_root=run.service.link.topics.root,
                    make_trainer=attacking_trainer(attack),
                ),
                stop,
            ),
            name=f"attacker-{speaker}",
        )
        for speaker, attack in attacks.items()
    ]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
