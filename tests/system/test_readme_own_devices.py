"""The README's "Your own devices", followed as written, then a listener on speakers the fleet never heard.

Every command is read from that section of the README (its task file, `devices add`, `broker-config`,
Mosquitto, `coordinator`, `client` and `listen`), so the text and this test cannot drift. Only what a test
machine needs is changed: the addresses and ports (the machine's own Mosquitto holds 1883),
`~/fedspeech-data` (each device's folder), a third device enrolled as the second is, Mosquitto run in the
foreground, and `--input` given to `listen` in place of a microphone.

The devices hold Speech Commands speakers, at most 20 takes a label; garage-pi has no "on" and no "off".
The coordinator holds no speech and is given no --eval-data: the model's detection threshold comes from
the devices' own test clips. `fedspeech listen` then hears a stream of words of speakers no device holds,
and must hear at least as many of them as the model's accuracy on the same clips, less 10 points.
"""

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import soundfile

from fedspeech.models.clips.datasets import Clip, load_corpus, load_waveforms
from fedspeech.runtime.session import OnnxModel
from fedspeech_bench.attacks.mosquitto import running_mosquitto
from fedspeech_bench.listen_streams import build_stream
from fedspeech_bench.word_alignment import align
from tests.helpers.ports import free_port
from tests.helpers.readme import own_devices_blocks
from tests.helpers.shared_data import SHARED_DATA, needs_shared
from tests.helpers.waiting import get_json, wait_for

TAKES = 20  # a label, on a device
DEVICES: dict[str, tuple[str, ...]] = {
    "kitchen-pi": (),
    "hall-pi": (),
    "garage-pi": ("on", "off"),
}  # a device and the labels it lacks
HEARD_WORDS = 10  # a label, in the stream the listener hears
DETECTION = re.compile(r"^\s*([\d.]+) s  (\S+)  ([\d.]+)$")


def _build_folders(root: Path) -> tuple[dict[str, Path], list[Clip], list[str]]:
    """A data folder per device from every fourth speaker, and the clips of the speakers left over."""
    corpus = load_corpus("speech_commands", SHARED_DATA)
    labels = [label for label in corpus.labels if not label.startswith("_")]
    by_speaker: dict[str, list[Clip]] = defaultdict(list)
    for clip in corpus.clips:
        if corpus.labels[clip.label] in labels:
            by_speaker[clip.speaker].append(clip)
    speakers = sorted(by_speaker)
    folders = {}
    for i, (device, lacking) in enumerate(DEVICES.items()):
        folder, taken = root / device, defaultdict(int)
        for speaker in speakers[i::4]:
            for clip in by_speaker[speaker]:
                label = corpus.labels[clip.label]
                if label not in lacking and taken[label] < TAKES:
                    taken[label] += 1
                    (folder / label).mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(clip.path, folder / label / clip.path.name)
        folders[device] = folder
    unheard = [
        Clip(c.path, labels.index(corpus.labels[c.label]), c.speaker, True)
        for speaker in speakers[3::4]
        for c in by_speaker[speaker]
    ]
    return folders, unheard, labels


def _stream_of(unheard: list[Clip], labels: list[str]) -> list[Clip]:
    """HEARD_WORDS clips of each label, each of another speaker where there are enough."""
    rng = np.random.default_rng(0)
    chosen = []
    for index in range(len(labels)):
        of_label = [c for c in unheard if c.label == index]
        chosen += [of_label[i] for i in rng.choice(len(of_label), HEARD_WORDS, replace=False)]
    return chosen


def _command(line: str, places: dict[str, str]) -> list[str]:
    """A README command line as argv, with this machine's addresses and folders."""
    for written, here in places.items():
        line = line.replace(written, here)
    argv = shlex.split(line)
    return [sys.executable, "-m", "fedspeech", *argv[1:]] if argv[0] == "fedspeech" else argv


@needs_shared
@pytest.mark.skipif(
    not (SHARED_DATA / "speech_commands_test").is_dir(), reason=f"no speech_commands_test in {SHARED_DATA}"
)
@pytest.mark.timeout(900)
def test_the_readmes_own_devices_hear_speakers_they_never_met(tmp_path, processes):
    started = time.monotonic()
    http, mqtt = free_port(), free_port()
    folders, unheard, labels = _build_folders(tmp_path / "data")
    blocks = own_devices_blocks()
    task, setup = blocks[0], blocks[1]
    (client,) = [block[0] for block in blocks if block[0].startswith("fedspeech client --coordinator")]
    (listen,) = [block[0] for block in blocks if block[0].startswith("fedspeech listen --coordinator")]
    places = {
        "coordinator.lan:8080": f"127.0.0.1:{http}",
        "coordinator.lan:1883": f"127.0.0.1:{mqtt}",
        "127.0.0.1:1883": f"127.0.0.1:{mqtt}",
        "--host 0.0.0.0": "--host 127.0.0.1",
    }

    (tmp_path / "commands.toml").write_text("\n".join(task) + "\n")  # step 1
    assert json.loads(task[1].split("=", 1)[1]) == labels
    enrol = [line for line in setup if line.startswith("fedspeech devices add")]
    assert "kitchen-pi" in enrol[0] and "hall-pi" in enrol[1]
    enrol.append(enrol[1].replace("hall-pi", "garage-pi"))
    for line in enrol:
        subprocess.run(_command(line, places), cwd=tmp_path, check=True, capture_output=True, timeout=120)
    (broker_config,) = [line for line in setup if line.startswith("fedspeech broker-config")]
    subprocess.run(
        _command(broker_config, places) + ["--port", str(mqtt)],
        cwd=tmp_path, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    (mosquitto,) = [line for line in setup if "mosquitto -c" in line]
    config = tmp_path / shlex.split(mosquitto)[2]
    (coordinator,) = [line for line in setup if line.startswith("fedspeech coordinator")]
    rounds = int(shlex.split(coordinator)[-1])
    with running_mosquitto(config, mqtt):
        processes.start("coordinator", *_command(coordinator, places)[3:], "--port", str(http), cwd=tmp_path)
        for device, folder in folders.items():
            written = client.replace("kitchen-pi", device).replace("~/fedspeech-data", str(folder))
            processes.start(device, *_command(written, places)[3:], cwd=tmp_path)
        url = f"http://127.0.0.1:{http}"
        wait_for(lambda: (get_json(f"{url}/api/status") or {}).get("finished"), 720, f"{rounds} rounds", 2.0)
        trained_s = time.monotonic() - started

        # the model's accuracy on the clips of speakers no device holds, each whole and centred
        with urllib.request.urlopen(f"{url}/api/models/{rounds}/onnx", timeout=60) as reply:
            (tmp_path / "model.onnx").write_bytes(reply.read())
        model = OnnxModel(tmp_path / "model.onnx")
        assert "calibrated on" in model.metadata["threshold_from"], model.metadata
        heard_clips = _stream_of(unheard, labels)
        waveforms, truth = load_waveforms(heard_clips, model.sample_rate, model.num_samples)
        clip_accuracy = float(np.mean(model.predict(waveforms).argmax(axis=1) == truth))

        # step 6, hearing those words in a stream
        stream = build_stream(heard_clips, labels, model.sample_rate, pause_s=1.0, seed=0)
        soundfile.write(tmp_path / "words.wav", stream.audio, stream.sample_rate)
        argv = _command(listen, places) + ["--input", str(tmp_path / "words.wav")]
        heard = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        status = _command(f"fedspeech status --coordinator {url} --rounds 3", {})
        shown = subprocess.run(status, capture_output=True, text=True, timeout=60, check=True).stdout
        listing = _command(f"fedspeech devices list --coordinator {url}", {})
        listed = subprocess.run(listing, capture_output=True, text=True, timeout=60, check=True).stdout
    assert sorted(listed.splitlines()) == [f"{device}\tregistered\tonline" for device in sorted(folders)], (
        listed
    )
    assert f"detection: threshold {float(model.metadata['threshold']):.3f}, calibrated on" in shown, shown
    assert heard.returncode == 0, heard.stderr[-3000:]
    detected = [m.group(2) for line in heard.stdout.splitlines() if (m := DETECTION.match(line))]
    alignment = align([word.label for word in stream.words], detected)
    hit_rate = alignment.hits / alignment.words
    threshold = re.search(r"detection threshold ([\d.]+) \((.*)\)$", heard.stderr, re.MULTILINE)
    said = threshold.group(0) if threshold else heard.stderr[-500:]
    print(
        f"\n{rounds} rounds in {trained_s:.0f} s; model accuracy {clip_accuracy:.4f} on {len(truth)} clips "
        f"of unheard speakers; listener heard {alignment.hits} of {alignment.words} ({hit_rate:.4f}), "
        f"{alignment.substitutions} wrong, {alignment.insertions} extra; {said}; whole flow "
        f"{time.monotonic() - started:.0f} s\n{shown}"
    )
    assert threshold and "calibrated on" in threshold.group(2), heard.stderr[-2000:]
    assert hit_rate >= clip_accuracy - 0.10
