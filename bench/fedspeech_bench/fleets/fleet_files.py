"""Fleet files: a TOML list of emulated devices, each with its CPU share and the network in front of it."""

import importlib.resources
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLEETS_DIR = Path(str(importlib.resources.files("fedspeech_bench.fleets")))
DEFAULT_FLEETS = {"fsdd": FLEETS_DIR / "pi-mix.toml", "emodb": FLEETS_DIR / "pi-mix-10.toml"}


def shipped_fleets() -> list[str]:
    """The names of the fleet files that come with fedspeech-bench (pi-mix for pi-mix.toml, ...)."""
    return sorted(path.stem for path in FLEETS_DIR.glob("*.toml"))


def fleet_path(fleet: str | Path) -> Path:
    """A fleet file's path: a file's, else a shipped fleet's by its name (pi-mix); it may not exist."""
    path = Path(fleet)
    if not path.is_file() and str(fleet) in shipped_fleets():
        return FLEETS_DIR / f"{fleet}.toml"
    return path


@dataclass(frozen=True)
class DeviceSpec:
    """One emulated device: name, whose recordings it trains on (speaker or folder), CPU share, network."""

    name: str
    speaker: str
    cpu_share: float  # fraction of one core, in (0, 1]
    delay_ms: float = 0.0  # added round-trip latency to coordinator and broker
    bandwidth_kbps: float | None = None  # None: not limited
    # set instead of speaker: the process hosts one device per speaker, named by it, all sharing its
    # CPU share and network (a fleet of hundreds does not fit in a process each)
    speakers: tuple[str, ...] = ()
    # set instead of speaker: the device trains on its own folder DATA/<label>/* (`fedspeech client --data`)
    data: Path | None = None

    @property
    def device_ids(self) -> list[str]:
        """The ids of the devices this process runs."""
        return list(self.speakers) or [self.name]


def hosted_fleet(speakers: list[str], hosts: int, cpu_share: float) -> list[DeviceSpec]:
    """Many speaker devices spread round-robin over `hosts` processes of cpu_share each."""
    return [
        DeviceSpec(f"host-{i + 1}", "", cpu_share, speakers=tuple(speakers[i::hosts]))
        for i in range(min(hosts, len(speakers)))
    ]


_FIELDS = {"name": str, "speaker": str, "cpu_share": float, "delay_ms": float, "bandwidth_kbps": float}
_REQUIRED = ("name", "speaker", "cpu_share")


def _check_device(spec: DeviceSpec, where: str) -> None:
    if not 0.0 < spec.cpu_share <= 1.0:
        raise ValueError(f"{where}: cpu_share must be in (0, 1] (of one core), got {spec.cpu_share}")
    if spec.delay_ms < 0:
        raise ValueError(f"{where}: delay_ms must not be negative, got {spec.delay_ms}")
    if spec.bandwidth_kbps is not None and spec.bandwidth_kbps <= 0:
        raise ValueError(f"{where}: bandwidth_kbps must be positive, got {spec.bandwidth_kbps}")


def _device_from_table(table: object, where: str) -> DeviceSpec:
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table of device settings")
    unknown = sorted(set(table) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown}, expected some of {sorted(_FIELDS)}")
    missing = [key for key in _REQUIRED if key not in table]
    if missing:
        raise ValueError(f"{where}: missing {missing}")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if _FIELDS[key] is str:
            if not isinstance(value, str) or not value:
                raise ValueError(f"{where}: {key} must be a non-empty string, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: {key} must be a number, got {value!r}")
        values[key] = value if _FIELDS[key] is str else float(value)
    spec = DeviceSpec(**values)
    _check_device(spec, where)
    return spec


def load_fleet(path: str | Path) -> list[DeviceSpec]:
    """Read a fleet file: a list of [[device]] tables. ValueError says which device and setting is wrong."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    other = sorted(set(document) - {"device"})
    if other:
        raise ValueError(f"{path}: unknown top-level key(s) {other}; devices go in [[device]] tables")
    tables = document.get("device")
    if not isinstance(tables, list) or not tables:
        raise ValueError(f"{path}: no [[device]] tables")
    fleet = [_device_from_table(table, f"{path}: device {i + 1}") for i, table in enumerate(tables)]
    names = [spec.name for spec in fleet]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"{path}: device names must be unique, repeated: {duplicates}")
    return fleet


def machine_cores() -> int:
    """Cores this process may run on (its affinity mask, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_fleet(fleet: list[DeviceSpec], cores: int | None = None) -> None:
    """ValueError unless every share is in (0, 1] and together they stay below the machine's cores.

    The devices must never slow each other down: a device's measured speed has to come from its own
    quota, not from competing with the others (or with the coordinator) for a saturated machine.
    """
    if not fleet:
        raise ValueError("the fleet has no devices")
    for spec in fleet:
        _check_device(spec, f"device {spec.name!r}")
    cores = machine_cores() if cores is None else cores
    total = sum(spec.cpu_share for spec in fleet)
    if total >= cores:
        raise ValueError(
            f"the devices' CPU shares add up to {total:.2f} cores but this machine has {cores}: "
            "they would slow each other down; lower the shares or run fewer devices"
        )
