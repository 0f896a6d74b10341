"""Start an emulated fleet: one device daemon per spec, CPU-limited and behind its own delaying proxies."""

import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from fedspeech_bench.fleets.cpu_limits import ONE_THREAD, DeviceProcess, run_limited
from fedspeech_bench.fleets.fleet_files import DeviceSpec
from fedspeech_bench.fleets.network_proxy import DelayProxy


def _proxy_url(url: str, proxy: DelayProxy) -> str:
    parts = urlsplit(url)
    netloc = f"127.0.0.1:{proxy.port}"
    if parts.username:
        credentials = parts.username + (f":{parts.password}" if parts.password else "")
        netloc = f"{credentials}@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _upstream(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"no host in URL {url!r}")
    return parts.hostname, parts.port or default_port


def proxied_urls(
    spec: DeviceSpec, coordinator_url: str, broker_url: str
) -> tuple[str, str, list[DelayProxy]]:
    """(coordinator URL, broker URL, started proxies) as the device should use them.

    With no delay and no bandwidth limit the URLs come back unchanged and no proxy is started.
    Otherwise one DelayProxy per upstream (HTTP and MQTT) adds spec.delay_ms of round-trip and paces
    to spec.bandwidth_kbps; stop them (DeviceProcess.stop does) when the device is done.
    """
    if spec.delay_ms <= 0 and spec.bandwidth_kbps is None:
        return coordinator_url, broker_url, []
    http_default = 443 if urlsplit(coordinator_url).scheme == "https" else 80
    proxies: list[DelayProxy] = []
    try:
        urls = []
        for url, default_port in ((coordinator_url, http_default), (broker_url, 1883)):
            proxy = DelayProxy(*_upstream(url, default_port), spec.delay_ms, spec.bandwidth_kbps).start()
            proxies.append(proxy)
            urls.append(_proxy_url(url, proxy))
    except BaseException:
        for proxy in proxies:
            proxy.stop()
        raise
    return urls[0], urls[1], proxies


def start_device(
    spec: DeviceSpec,
    args: list[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    *,
    proxies: list[DelayProxy] | None = None,
    method: str | None = None,
) -> DeviceProcess:
    """Run `python -m fedspeech client ARGS --threads 1` as spec's device, CPU-limited to its share.

    args carry the coordinator and broker URLs (through proxied_urls' proxies when the spec has a
    delay or bandwidth; pass those proxies here so stop() ends them too), the speaker and the rest.
    One thread for torch and for BLAS (OMP_NUM_THREADS=1): the share is of one core. env holds
    variables added to this process' environment.
    """
    argv = [sys.executable, "-m", "fedspeech", "client", *args]
    if "--threads" not in args:
        argv += ["--threads", "1"]
    child_env = {**(env or {}), **ONE_THREAD, "PYTHONUNBUFFERED": "1"}
    return run_limited(
        spec.cpu_share, argv, name=spec.name, log_path=log_path, env=child_env, method=method, proxies=proxies
    )


def launch_fleet(
    fleet: list[DeviceSpec],
    coordinator_url: str,
    broker_url: str,
    corpus: str,
    data_dir: Path | None,
    log_dir: Path,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> list[DeviceProcess]:
    """One device daemon per spec behind its own proxies, logged to LOG_DIR/NAME.log.

    Each device runs `fedspeech client --corpus C [--data-dir D] --speaker S --device-id NAME`, or
    `fedspeech client --data DIR --device-id NAME` for a spec with a data folder, plus extra_args (topic
    root, max samples, ...). If one fails to start, those already started are stopped.
    Callers that compare timings run check_fleet first.
    """
    devices: list[DeviceProcess] = []
    try:
        for spec in fleet:
            coordinator, broker, proxies = proxied_urls(spec, coordinator_url, broker_url)
            if spec.data is not None:
                args = ["--data", str(spec.data), "--device-id", spec.name]
            else:
                args = ["--corpus", corpus]
                if spec.speakers:
                    args += [arg for speaker in spec.speakers for arg in ("--speaker", speaker)]
                else:
                    args += ["--speaker", spec.speaker, "--device-id", spec.name]
                args += ["--data-dir", str(data_dir)] if data_dir is not None else []
            args += ["--coordinator", coordinator, "--broker", broker, *(extra_args or [])]
            devices.append(start_device(spec, args, Path(log_dir) / f"{spec.name}.log", env, proxies=proxies))
    except BaseException:
        stop_fleet(devices)
        raise
    return devices


def stop_fleet(devices: list[DeviceProcess], timeout: float = 20.0) -> None:
    """SIGTERM every device at once, then stop each (wait, kill, clean up)."""
    for device in devices:
        device.terminate()
    for device in devices:
        device.stop(timeout)
