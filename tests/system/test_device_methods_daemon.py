"""The device methods in a running device daemon: the teacher fetched like the weights, the normalisation
layers kept in the state folder, and the personalised model in the model folder."""

from dataclasses import replace
from pathlib import Path

import numpy as np

from fedspeech.edge_client.local_norm import LocalNorm
from fedspeech.edge_client.model_keeper import KEPT_MODEL
from fedspeech.export.onnx_export import PREFIX, export_onnx
from fedspeech.models import build_model
from fedspeech.models.train import set_arrays
from fedspeech.protocol import weights
from fedspeech.protocol.messages import BlobRef, ModelSpec
from tests.helpers.device_doubles import FSDD, CoordinatorDouble, fleet_of, running_daemon, wait_until
from tests.helpers.device_doubles import make_task as edge_task
from tests.helpers.device_models import TEACHER, fresh, initializers, names_of_norm, uploaded


def test_the_daemon_distils_keeps_its_norm_and_personalises_its_model(tmp_path: Path) -> None:
    spec = ModelSpec("cnn_bn", sample_rate=8000, num_samples=8000, num_classes=len(FSDD.labels))  # 1 s
    start, teacher = fresh(spec), weights.encode(fresh(spec, seed=5))
    coordinator = CoordinatorDouble(weights.encode(start), files={TEACHER.path: teacher})
    models = tmp_path / "models"
    with fleet_of(coordinator, tmp_path / "device-state") as fleet, running_daemon(fleet, model_dir=models):
        task = replace(
            edge_task("mkd-fedbn", blob=coordinator.blob),
            spec=spec,
            config={"local_norm": 1.0, "distill_weight": 1.0, "distill_temperature": 2.0},
            teacher=BlobRef(TEACHER.path, weights.sha256(teacher), len(teacher)),
        )
        fleet.send_task(task)
        wait_until(lambda: coordinator.uploads, timeout=60)
        names = names_of_norm(spec)
        assert uploaded(coordinator.uploads[0].body)[0].keys() == start.keys() - names
        assert TEACHER.path in coordinator.downloads
        kept = LocalNorm(fleet.state_dir).load()
        assert kept is not None and kept.keys() == names

        model = build_model(spec)
        set_arrays(model, start)
        global_onnx = export_onnx(model, spec, FSDD.labels, tmp_path / "global.onnx", round=1)
        fleet.announce(1, global_onnx.read_bytes())
        wait_until(lambda: (models / KEPT_MODEL).exists(), timeout=30)
    personal = initializers(models / KEPT_MODEL)
    for name in names:
        np.testing.assert_array_equal(personal[PREFIX + name], kept[name])
