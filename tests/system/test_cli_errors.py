"""A new user's first hour: each mistake or broken environment ends in one line that names the fix.

Every case runs the real command, `python -m fedspeech ...`, and expects exit code 1 and, on stderr,
one line `fedspeech <command>: <reason and fix>`: never a traceback. The few that start a long-running
process wait for the one line they expect, with a timeout.
"""

import logging
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fedspeech.coordinator.broker.embedded import EmbeddedBroker
from tests.helpers.ports import free_port
from tests.helpers.shared_data import SHARED_DATA, needs_shared
from tests.helpers.waiting import get_json, wait_for

CLIENT_LOG = "fedspeech.edge_client.coordinator_http"
FSDD_CLIP = Path(__file__).resolve().parents[2] / "data" / "fsdd" / "recordings" / "0_george_0.flac"


def fedspeech(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `python -m fedspeech ARGS` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "fedspeech", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def assert_one_line(result: subprocess.CompletedProcess, command: str, *fixes: str) -> str:
    """Exit code 1 and stderr one line, `fedspeech COMMAND: ...`, holding every text in fixes."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"fedspeech {command}: "), lines[0]
    for fix in fixes:
        assert fix in lines[0], lines[0]
    return lines[0]


def assert_last_line(result: subprocess.CompletedProcess, command: str, *fixes: str) -> str:
    """As assert_one_line, for a command that logs its progress first: the last line says what is wrong."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fedspeech {command}: "), result.stderr
    for fix in fixes:
        assert fix in last, last
    return last


@pytest.fixture
def listening() -> Iterator[int]:
    """A port that something on 127.0.0.1 listens on, for the length of the test."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


# ---- the cases a new user found ----


def test_coordinator_beside_a_running_broker_says_to_use_it_or_another_port(mosquitto_url, tmp_path):
    # the machine's Mosquitto holds 1883, where the embedded broker would listen by default
    result = fedspeech(
        "coordinator", "--state", str(tmp_path / "state"), "--new-state", "--port", str(free_port())
    )
    line = assert_one_line(result, "coordinator", "127.0.0.1:1883", "address already in use")
    assert "--broker mqtt://127.0.0.1:1883" in line and "--broker-port N" in line
    assert not (tmp_path / "state").exists(), "stopped before anything started"


def test_the_embedded_broker_on_a_taken_port_raises_one_oserror_and_logs_no_traceback(listening, caplog):
    broker = EmbeddedBroker("127.0.0.1", listening)
    with caplog.at_level(logging.DEBUG), pytest.raises(OSError, match="already in use") as raised:
        broker.start()
    broker.stop()
    assert raised.value.errno is not None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text


def test_bench_privacy_refuses_a_fleet_size_out_of_bounds():
    result = fedspeech("bench", "privacy", "--devices", "2,6")
    assert_one_line(result, "bench privacy", "each from 3 to 255")


def test_client_for_a_speaker_the_corpus_lacks_names_the_speakers():
    result = fedspeech("client", "--speaker", "nobody")
    assert_one_line(
        result, "client", "no speaker 'nobody'", "george, jackson, lucas, nicolas, theo, yweweler"
    )


@needs_shared
def test_client_for_a_speaker_of_a_large_corpus_names_some_of_its_speakers():
    args = ["--corpus", "speech_commands", "--speaker", "03", "--data-dir", str(SHARED_DATA)]
    result = fedspeech("client", *args)
    assert_one_line(result, "client", "no speaker '03'", "more")


def _with_places(args: list[str], tmp_path: Path, broker: str) -> tuple[list[str], str]:
    """args with a state folder and broker for the coordinator, a results folder for a bench; its command."""
    if args[0] == "coordinator":  # its own broker and port are not what these cases are about
        state = ["--state", str(tmp_path / "state"), "--new-state"]
        return [*args, *state, "--broker", broker, "--port", "0"], "coordinator"
    if args[0] == "bench":
        return [*args, "--out", str(tmp_path / "out")], " ".join(args[:2])
    return args, args[0]


@pytest.mark.parametrize(
    "args",
    [
        ["client", "--corpus", "emodb", "--speaker", "03"],
        ["bench", "strategies", "--corpus", "emodb"],
        ["bench", "central", "--corpus", "emodb"],
        ["bench", "central", "--corpus", "speech_commands"],
        ["bench", "growing", "--corpus", "speech_commands"],
        ["coordinator", "--eval-corpus", "emodb"],
        ["coordinator", "--task", "emodb", "--eval-corpus", "emodb"],
    ],
    ids=" ".join,
)
def test_a_corpus_that_is_not_bundled_asks_for_the_folder_holding_it(args, mosquitto_url, tmp_path):
    args, command = _with_places(args, tmp_path, mosquitto_url)
    assert_one_line(fedspeech(*args), command, "not in the bundled data", "as --data-dir DIR")
    assert not (tmp_path / "state").exists(), "the coordinator stopped before its state was touched"


@pytest.mark.parametrize(
    "args",
    [
        ["client", "--corpus", "emodb", "--speaker", "03"],
        ["bench", "strategies", "--corpus", "emodb"],
        ["bench", "central", "--corpus", "emodb"],
        ["bench", "growing", "--corpus", "speech_commands"],
        ["coordinator", "--eval-corpus", "emodb"],
    ],
    ids=" ".join,
)
def test_a_wrong_data_dir_says_what_it_must_hold(args, mosquitto_url, tmp_path):
    args, command = _with_places(args, tmp_path, mosquitto_url)
    result = fedspeech(*args, "--data-dir", str(tmp_path / "corpora"))
    assert_one_line(result, command, f"no folder {tmp_path / 'corpora'}", "--data-dir DIR must hold")


def test_a_coordinator_polled_writes_no_request_lines_to_its_log(processes, tmp_path):
    port = free_port()
    coordinator = processes.start(
        "coordinator", "coordinator", "--state", str(tmp_path / "state"), "--new-state",
        "--port", str(port), "--broker-port", str(free_port()),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/api/status"
    wait_for(lambda: get_json(url), 120, "the coordinator's API")
    for _ in range(5):
        with urllib.request.urlopen(url, timeout=5) as reply:
            assert reply.status == 200
    coordinator.send_signal(signal.SIGTERM)
    assert coordinator.wait(timeout=60) == 0
    log = coordinator.log_path.read_text()
    assert "INFO fedspeech.coordinator.http.server: coordinator HTTP API on" in log, "logging at INFO"
    assert "/api/status" not in log, log
    assert "Skipping constant folding" not in log, "nor the ONNX export's internals"


def test_bench_inference_keeps_onnxruntime_quantisation_advice_to_itself(tmp_path):
    import torch

    from fedspeech.export.onnx_export import export_onnx
    from fedspeech.models import build_model
    from fedspeech.models.clips.datasets import default_spec, load_corpus

    corpus = load_corpus("fsdd")
    spec = default_spec(corpus)
    torch.manual_seed(0)
    untrained = build_model(spec)
    model = export_onnx(untrained, spec, corpus.task.labels, tmp_path / "model.onnx", round=0, task="fsdd")
    out = tmp_path / "out"
    result = fedspeech("bench", "inference", "--model", str(model), "--out", str(out), "--repeats", "5")
    assert "pre-processing before quantization" not in result.stderr, result.stderr
    assert (out / "model-int8.onnx").is_file(), "it did quantise"
    # an untrained model hears no word, so the listener's cold start cannot be timed: one line says so
    assert_last_line(result, "bench inference", "heard no word", "trained model")


# ---- every subcommand, tried as a new user would ----


def _cases(tmp: Path, busy: int, broker: str, nothing: str) -> dict[str, tuple[list[str], str, list[str]]]:
    """name -> (arguments, the command named, texts its line holds).

    busy: a port something listens on; broker: one that answers; nothing: a broker URL where none does.
    """
    text_file = tmp / "notes.txt"
    coordinator = [
        "coordinator",
        "--state",
        str(tmp / "state"),
        "--new-state",
        "--broker",
        broker,
        "--port",
        "0",
    ]
    return {
        "coordinator unknown option": (
            ["coordinator", "--corpus", "emodb"],
            "coordinator",
            ["--corpus emodb", "--help"],
        ),
        "coordinator port out of range": (
            ["coordinator", "--port", "70000"],
            "coordinator",
            ["--port", "65535"],
        ),
        "coordinator no rounds": (
            ["coordinator", "--rounds", "0"],
            "coordinator",
            ["--rounds", "at least 1"],
        ),
        "coordinator rounds not a number": (
            ["coordinator", "--rounds", "ten"],
            "coordinator",
            ["--rounds", "'ten'"],
        ),
        "coordinator zero k": (["coordinator", "--k", "0"], "coordinator", ["--k", "at least 1"]),
        "coordinator negative timeout": (
            ["coordinator", "--http-timeout", "-1"],
            "coordinator",
            ["--http-timeout"],
        ),
        "coordinator unknown strategy": (
            [*coordinator, "--strategy", "fedbest"],
            "coordinator",
            ["'fedbest'", "fedavg"],
        ),
        "coordinator setting out of bounds": (
            [*coordinator, "--strategy", "fedprox", "--strategy-setting", "mu=-1"],
            "coordinator",
            ["strategy fedprox", "mu must be between 0 and 100"],
        ),
        "coordinator setting the strategy lacks": (
            [*coordinator, "--strategy", "trimmed_mean", "--strategy-setting", "mu=1"],
            "coordinator",
            ["strategy trimmed_mean", "unknown setting 'mu'", "its settings: trim"],
        ),
        "coordinator dp options around a strategy that does not average": (
            [*coordinator, "--strategy", "median", "--dp-epsilon", "8"],
            "coordinator",
            ["differential privacy wraps a strategy that averages; median does not"],
        ),
        "coordinator dp delta out of bounds": (
            [*coordinator, "--dp-delta", "0.5"],
            "coordinator",
            ["delta must be between"],
        ),
        "coordinator setting that is no name=value": (
            [*coordinator, "--strategy", "fedprox", "--strategy-setting", "mu"],
            "coordinator",
            ["--strategy-setting", "name=value"],
        ),
        "coordinator HTTP port taken": (
            [*coordinator[:-1], str(busy)],
            "coordinator",
            [f"127.0.0.1:{busy}", "already in use", "--port N"],
        ),
        "coordinator host not this machine's": (
            [*coordinator[:-1], "18080", "--host", "192.0.2.1"],
            "coordinator",
            ["192.0.2.1", "--host"],
        ),
        "coordinator TLS files missing": (
            [*coordinator, "--tls-cert", str(tmp / "cert.pem"), "--tls-key", str(tmp / "key.pem")],
            "coordinator",
            ["--tls-cert", "no such file"],
        ),
        "coordinator init misspelt": (
            [*coordinator, "--init", "synthetc"],
            "coordinator",
            ["--init synthetc: no such file", "random, synthetic or a .safetensors file"],
        ),
        "coordinator eval data missing": (
            [*coordinator, "--eval-data", str(tmp / "clips")],
            "coordinator",
            ["--eval-data", "no such folder"],
        ),
        "coordinator password file missing": (
            [*coordinator, "--broker-password-file", str(tmp / "password")],
            "coordinator",
            ["no such file"],
        ),
        "coordinator task file missing": (
            [*coordinator, "--task", str(tmp / "commands.toml")],
            "coordinator",
            ["no such task file"],
        ),
        "client no data folder": (
            ["client", "--data", str(tmp / "recordings")],
            "client",
            ["no data folder"],
        ),
        "client negative max samples": (
            ["client", "--speaker", "theo", "--max-samples", "-3"],
            "client",
            ["--max-samples", "at least 1"],
        ),
        "client no threads": (["client", "--speaker", "theo", "--threads", "0"], "client", ["--threads"]),
        "client not a URL": (
            ["client", "--speaker", "theo", "--coordinator", "coordinator.lan"],
            "client",
            ["http://HOST:PORT"],
        ),
        "client secret file missing": (
            ["client", "--speaker", "theo", "--enrolment-secret-file", str(tmp / "secret")],
            "client",
            ["enrolment secret", "No such file"],
        ),
        "client too many shared clips": (
            ["client", "--speaker", "theo", "--share-validation", "1000"],
            "client",
            ["at most 100"],
        ),
        "client unknown corpus": (
            ["client", "--speaker", "theo", "--corpus", "timit"],
            "client",
            ["'timit'"],
        ),
        "demo unknown strategy": (["demo", "--strategy", "fedbest"], "demo", ["'fedbest'", "fedavg"]),
        "demo port out of range": (["demo", "--port", "70000"], "demo", ["--port", "65535"]),
        "demo no rounds": (["demo", "--rounds", "0"], "demo", ["--rounds", "at least 1"]),
        "demo fleet file missing": (
            ["demo", "--fleet", str(tmp / "fleet.toml")],
            "demo",
            ["--fleet", "no such file", "pi-mix, pi-mix-10"],
        ),
        "demo HTTP port taken": (["demo", "--port", str(busy)], "demo", ["already in use", "--port N"]),
        "demo broker not answering": (["demo", "--broker", nothing], "demo", [nothing, "connection refused"]),
        "demo results folder is a file": (["demo", "--out", str(text_file)], "demo", ["is a file"]),
        "bench strategies no seeds": (
            ["bench", "strategies", "--seeds", "0"],
            "bench strategies",
            ["--seeds"],
        ),
        "bench strategies negative rounds": (
            ["bench", "strategies", "--rounds", "-1"],
            "bench strategies",
            ["--rounds", "at least 1"],
        ),
        "bench strategies no k": (["bench", "strategies", "--k", "0"], "bench strategies", ["--k"]),
        "bench growing unknown arm": (
            ["bench", "growing", "--arm", "tallest"],
            "bench growing",
            ["no arm tallest", "arms: fixed, fixed_unscaled"],
        ),
        "bench growing bad target": (
            ["bench", "growing", "--target", "fsdd"],
            "bench growing",
            ["CORPUS=ACCURACY"],
        ),
        "bench central no epochs": (["bench", "central", "--epochs", "-1"], "bench central", ["--epochs"]),
        "bench central unknown speaker": (
            ["bench", "central", "--leave-out", "nobody"],
            "bench central",
            ["fsdd has no speaker 'nobody'", "george"],
        ),
        "bench central results folder is a file": (
            ["bench", "central", "--out", str(text_file)],
            "bench central",
            ["is a file"],
        ),
        "bench inference model missing": (
            ["bench", "inference", "--model", str(tmp / "model.onnx")],
            "bench inference",
            ["no model at", "demo"],
        ),
        "bench inference not a model": (
            ["bench", "inference", "--model", str(text_file), "--out", str(tmp / "out")],
            "bench inference",
            ["not a usable"],
        ),
        "bench inference no repeats": (
            ["bench", "inference", "--repeats", "0"],
            "bench inference",
            ["--repeats"],
        ),
        "bench unknown": (["bench", "speed"], "bench", ["'speed'", "inference"]),
        "listen negative duration": (
            ["listen", "--input", str(FSDD_CLIP), "--duration", "-1"],
            "listen",
            ["--duration"],
        ),
        "listen not a URL": (["listen", "--coordinator", "coordinator.lan"], "listen", ["http://HOST:PORT"]),
        "record required options": (["record", "--task", "fsdd", "--label", "1"], "record", ["--data"]),
        "broker-config wildcard root": (
            ["broker-config", "--state", str(tmp / "state"), "--topic-root", "fleet/#"],
            "broker-config",
            ["--topic-root 'fleet/#'", "letters, digits"],
        ),
    }


@pytest.mark.parametrize("case", list(_cases(Path(), 0, "", "")))
def test_a_mistake_ends_in_one_line_that_names_the_fix(case, tmp_path, listening, mosquitto_url):
    (tmp_path / "notes.txt").write_text("not a model, not a folder\n")
    nothing = f"mqtt://127.0.0.1:{free_port()}"
    args, command, fixes = _cases(tmp_path, listening, mosquitto_url, nothing)[case]
    assert_one_line(fedspeech(*args, cwd=tmp_path), command, *fixes)
    assert not (tmp_path / "state").exists(), "the coordinator stopped before its state was touched"


@pytest.mark.parametrize(
    ("text", "fixes"),
    [
        ("[rounds]\nroundz = 3\n", ["[rounds] roundz", "did you mean rounds?"]),
        ("[rounds]\nrounds = 0\n", ["coordinator.toml", "rounds must be at least 1, got 0"]),
        ("[strategy]\nname = 'fedprox'\nmu = -1\n", ["coordinator.toml", "strategy fedprox", "mu must be"]),
        (
            "[evaluation]\neval_data = 'clips'\n",
            ["coordinator.toml [evaluation] eval_data", "no such folder"],
        ),
    ],
)
def test_a_bad_config_file_ends_in_one_line_naming_the_file_and_key(text, fixes, mosquitto_url, tmp_path):
    (tmp_path / "coordinator.toml").write_text(f"[service]\nbroker = '{mosquitto_url}'\n{text}")
    result = fedspeech("coordinator", "--config", "coordinator.toml", "--port", "0", cwd=tmp_path)
    assert_one_line(result, "coordinator", *fixes)
    assert not (tmp_path / "fedspeech-state").exists(), "the coordinator stopped before its state was touched"


def test_a_bad_state_folder_ends_in_one_line_after_the_start_up_log(mosquitto_url, tmp_path):
    (tmp_path / "state").write_text("a file, not a folder\n")
    args = ["--state", str(tmp_path / "state"), "--new-state", "--broker", mosquitto_url, "--port", "0"]
    result = fedspeech("coordinator", *args)
    assert_last_line(result, "coordinator", "cannot use the state directory", str(tmp_path / "state"))


def test_a_coordinator_refuses_a_folder_without_a_state_unless_told(mosquitto_url, tmp_path):
    mistyped = tmp_path / "fleet" / "stat"
    result = fedspeech("coordinator", "--state", str(mistyped), "--broker", mosquitto_url, "--port", "0")
    assert_one_line(result, "coordinator", f"no coordinator state in {mistyped}", "--state", "--new-state")
    assert not (tmp_path / "fleet").exists(), "nothing made"


def test_devices_add_refuses_a_folder_without_a_coordinators_state_unless_told(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    refused = fedspeech("devices", "add", "kitchen-pi", "--state", str(elsewhere))
    assert_one_line(refused, "devices", f"no coordinator state in {elsewhere}", "--state DIR", "--new-state")
    assert not elsewhere.exists(), "nothing made"


def test_devices_add_writes_a_private_secret_file_and_names_the_state_it_enrolled_into(tmp_path):
    first = fedspeech(
        "devices", "add", "kitchen-pi", "--new-state", "--secret-file", "kitchen.secret", cwd=tmp_path
    )
    assert first.returncode == 0 and first.stdout == "", first.stderr
    state = tmp_path / "fedspeech-state"
    assert f"enrolled kitchen-pi into the new coordinator's state {state};" in first.stderr
    secret = tmp_path / "kitchen.secret"
    assert secret.stat().st_mode & 0o777 == 0o600
    assert len(secret.read_text().strip()) >= 32
    second = fedspeech("devices", "add", "hall-pi", "--secret-file", "hall.secret", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert f"enrolled hall-pi into the coordinator's state {state};" in second.stderr, "no --new-state needed"
    listed = fedspeech("devices", "list", cwd=tmp_path)
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["hall-pi", "kitchen-pi"]


def test_a_client_warns_in_one_line_about_a_secret_file_others_can_read(processes, tmp_path):
    secret = tmp_path / "kitchen-pi.secret"
    secret.write_text("a-secret-that-everyone-may-read\n")
    secret.chmod(0o644)  # as `fedspeech devices add ID > FILE` leaves it under the usual umask
    nothing = f"http://127.0.0.1:{free_port()}"
    client = processes.start(
        "client", "client", "--speaker", "theo", "--coordinator", nothing,
        "--state", str(tmp_path / "device"), "--enrolment-secret-file", str(secret),
    )  # fmt: skip
    warning = (
        f"WARNING fedspeech.protocol.files: the enrolment secret {secret} is readable by other "
        f"users (mode 644): make it private with `chmod 600 {secret}`"
    )
    wait_for(lambda: warning in client.log_path.read_text(), 90, "the warning")
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == 0
    assert client.log_path.read_text().count("readable by other users") == 1


def test_a_state_folder_the_coordinator_cannot_write_is_refused_at_start(mosquitto_url, tmp_path):
    from fedspeech.coordinator.state.store import Store

    state = tmp_path / "state"
    Store(state)  # a coordinator's state, as an earlier run left it
    # root writes whatever a file's mode says: a read-only bind mount, in a mount namespace of its own
    read_only = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"'
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", f'{read_only} && ! touch "$1/x"', "sh", state])
    if probe.returncode != 0:
        pytest.skip("cannot make a read-only bind mount here (needs unshare and mount, as root)")
    args = ["--state", str(state), "--broker", mosquitto_url, "--port", "0"]
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f'{read_only} && shift && exec "$@"', "sh", state,
         sys.executable, "-m", "fedspeech", "coordinator", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert_last_line(result, "coordinator", f"cannot write the state directory {state}", "--state")


def test_a_second_coordinator_on_a_taken_topic_root_ends_in_one_line(
    processes, mosquitto_url, topic_root, tmp_path
):
    port = free_port()
    common = ["--broker", mosquitto_url, "--topic-root", topic_root, "--new-state"]
    processes.start("first", "coordinator", "--state", str(tmp_path / "first"), "--port", str(port), *common)
    wait_for(
        lambda: (get_json(f"http://127.0.0.1:{port}/api/status") or {}).get("completed_round") == 0,
        120,
        "round 0",
    )
    second = fedspeech("coordinator", "--state", str(tmp_path / "second"), "--port", "0", *common)
    assert_last_line(second, "coordinator", topic_root, "--topic-root", "--take-over-topic-root")


# ---- peers that do not answer ----


def test_a_device_waits_for_its_coordinator_with_a_warning_a_try_and_stops_cleanly(processes, tmp_path):
    nothing = f"http://127.0.0.1:{free_port()}"
    client = processes.start(
        "client", "client", "--speaker", "theo", "--coordinator", nothing, "--state", str(tmp_path / "device")
    )
    warning = (
        f"WARNING {CLIENT_LOG}: task request to the coordinator at {nothing} failed (connection refused)"
    )
    wait_for(lambda: client.log_path.read_text().count(warning) >= 2, 90, "two tries, each with its warning")
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == 0
    assert "Traceback" not in client.log_path.read_text()


def test_a_device_refuses_a_url_that_is_no_coordinator(tmp_path):
    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        state = str(tmp_path / "device")
        result = fedspeech("client", "--speaker", "theo", "--coordinator", url, "--state", state)
    finally:
        server.shutdown()
        server.server_close()
    assert_last_line(result, "client", f"{url} answered GET /api/task with HTTP 404", "--coordinator")


def test_a_second_coordinator_on_one_state_folder_is_refused_naming_the_first(
    processes, tmp_path, mosquitto_url, topic_root
):
    state = tmp_path / "state"
    common = ["--state", str(state), "--new-state", "--broker", mosquitto_url, "--topic-root", topic_root]
    first = processes.start("coordinator", "coordinator", *common, "--port", "0")
    wait_for(
        lambda: "dashboard at" in first.log_path.read_text() or first.poll() is not None, 90, "the first"
    )
    assert first.poll() is None, first.log_path.read_text()[-2000:]
    assert f"a new coordinator state in {state}" in first.log_path.read_text()
    second = fedspeech("coordinator", *common, "--port", "0", "--topic-root", f"{topic_root}/other")
    assert_one_line(second, "coordinator", f"another coordinator (pid {first.pid}) runs on the state folder")
    assert first.poll() is None, "the first runs on"
    first.terminate()
    assert first.wait(timeout=60) == 0
    said = first.log_path.read_text()
    assert "stopping on SIGTERM" in said and f"stopped after round 0; started again on {state}" in said, said
    again = processes.start("again", "coordinator", *common, "--port", "0")  # the lock went with the first
    wait_for(lambda: "dashboard at" in again.log_path.read_text() or again.poll() is not None, 90, "again")
    assert again.poll() is None, again.log_path.read_text()[-2000:]
    assert "a new coordinator state" not in again.log_path.read_text(), "the state is the first's"


def test_a_coordinator_whose_broker_does_not_answer_says_so_and_keeps_trying(processes, tmp_path):
    nothing = f"mqtt://127.0.0.1:{free_port()}"
    coordinator = processes.start(
        "coordinator", "coordinator", "--state", str(tmp_path / "state"), "--new-state", "--broker", nothing,
        "--port", "0",
    )  # fmt: skip
    warning = f"cannot reach the broker at {nothing} (connection refused)"
    wait_for(lambda: warning in coordinator.log_path.read_text(), 120, "the coordinator's warning")
    assert coordinator.poll() is None, "a service waits for its broker"


def test_a_listener_whose_coordinator_does_not_answer_gives_up_in_one_line():
    nothing = f"http://127.0.0.1:{free_port()}"
    result = fedspeech("listen", "--coordinator", nothing, "--input", str(FSDD_CLIP))
    assert_last_line(result, "listen", "cannot get the coordinator's key", nothing)


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (200, "/api/key answered a web page: the URL is not a fedspeech coordinator's"),
        (404, "answered HTTP 404 with a web page, not a fedspeech coordinator's answer"),
    ],
)
def test_a_listener_pointed_at_a_web_page_says_it_is_no_coordinator(status, said):
    class Page(BaseHTTPRequestHandler):  # a router's admin page, say: HTML for every path
        def do_GET(self) -> None:
            page = (
                b"<!DOCTYPE html>\n<html><head><title>Router</title></head><body>"
                + b"x" * 500
                + b"</body></html>"
            )
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        result = fedspeech("listen", "--coordinator", url, "--input", str(FSDD_CLIP))
    finally:
        server.shutdown()
        server.server_close()
    assert_last_line(result, "listen", said)
    assert "<html" not in result.stderr + result.stdout, "the page is never printed"


def test_a_client_says_when_its_broker_does_not_answer(caplog):
    from fedspeech.protocol.mqtt import BrokerSettings, connect, make_client

    settings = BrokerSettings(f"mqtt://127.0.0.1:{free_port()}")
    client = make_client(settings, "nobody-listens")
    with caplog.at_level(logging.WARNING, logger="fedspeech.protocol.mqtt"):
        connect(client, settings)
        try:
            wait_for(lambda: "cannot reach the broker at " + settings.url in caplog.text, 10, "the warning")
        finally:
            client.loop_stop()
