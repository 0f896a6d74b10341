"""The tasks devices are handed: where to download the global model, and the work to do on it."""

import uuid
from collections.abc import Mapping
from typing import Any

from fedspeech.coordinator.config import RoundConfig
from fedspeech.coordinator.state.store import Store
from fedspeech.coordinator.strategies import RoundPlan
from fedspeech.protocol import routes, weights
from fedspeech.protocol.messages import BlobRef, ModelSpec, Task, TaskDefinition
from fedspeech.protocol.weights import Arrays


def training(config: RoundConfig, round: int, plan: RoundPlan, device: str) -> dict[str, Any]:
    """The task fields of a device's training in a round: the plan's work and a seed of its own."""
    work, index = plan.work[device], list(plan.work).index(device)
    return {
        "upload_path": routes.updates(round),
        "epochs": work.epochs,
        "config": dict(work.config),
        "seed": config.seed * 100_003 + round * 1009 + index,
    }


def evaluation(round: int, personal: Mapping[str, float]) -> dict[str, Any]:
    """The task fields of evaluating a round's model; with personal settings, each device's own."""
    fields: dict[str, Any] = {"upload_path": routes.evaluations(round), "epochs": 1, "action": "evaluate"}
    if personal:
        fields["config"] = dict(personal)
    return fields


def latest_weights(store: Store, precision: str, current: Arrays) -> BlobRef:
    """Where devices download the latest stored global weights (current), in the precision set.

    The float16 copy is written once per round, on first use: also for a round stored before the setting.
    """
    latest = store.latest_round()
    if latest is None:
        raise RuntimeError("no completed round yet")
    if precision == "float32":
        size = store.model_path(latest.round, "weights").stat().st_size
        return BlobRef(routes.model(latest.round, "weights"), latest.weights_sha256, size)
    path = store.model_path(latest.round, "float16")
    if not path.exists():
        half = weights.with_precision(current, "float16")
        store.save_model_file(latest.round, "float16", weights.encode(half, {"round": str(latest.round)}))
    blob = path.read_bytes()
    return BlobRef(routes.model(latest.round, "float16"), weights.sha256(blob), len(blob))


def make_tasks(
    round: int,
    deadline: float,
    work: Mapping[str, Mapping[str, Any]],
    *,
    model: BlobRef,
    spec: ModelSpec,
    definition: TaskDefinition,
    config: RoundConfig,
    learning_rate: float,
    teacher: BlobRef | None,
) -> dict[str, Task]:
    """One task per device, each with a fresh id, on the given model with that device's fields of work.

    The teacher goes only with training: an evaluation has nothing to distil.
    """
    return {
        device: Task(
            task_id=uuid.uuid4().hex,
            round=round,
            spec=spec,
            definition=definition,
            weights=model,
            batch_size=config.batch_size,
            learning_rate=learning_rate,
            deadline=deadline,
            teacher=teacher if fields.get("action", "train") == "train" else None,
            precision=config.precision,
            **fields,
        )
        for device, fields in work.items()
    }
