"""A round's new global model made durable: evaluated, exported, stored with its updates, and announced."""

import logging
import time
from dataclasses import dataclass, field

from fedspeech.coordinator.round.interfaces import ModelOps
from fedspeech.coordinator.state.records import RoundRecord, UpdateRecord
from fedspeech.coordinator.state.store import Store
from fedspeech.coordinator.strategies import PrivacySpent
from fedspeech.models.calibration import Decisions
from fedspeech.protocol import routes, weights
from fedspeech.protocol.messages import BlobRef, ModelAnnouncement
from fedspeech.protocol.weights import Arrays

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundTally:
    """What a round did besides its model: when it started, who took part, what crossed the wire."""

    started: float
    devices: int = 0  # selected
    updates: list[UpdateRecord] = field(default_factory=list)  # those in the model
    bytes_up: int = 0
    bytes_down: int = 0
    withdrawn: int = 0  # selected, and gone offline during the round or never took its task
    stragglers: int = 0  # selected, online, and not in time
    privacy: PrivacySpent | None = None  # differential privacy spent with this round in (None: none given)


FIRST_MODEL_KEY = "first_model"  # in round 0's weights metadata: how that model was made, in words


def store_round(
    store: Store,
    model: ModelOps,
    round: int,
    arrays: Arrays,
    tally: RoundTally,
    teacher: Arrays | None,
    decisions: Decisions | None = None,
) -> tuple[RoundRecord, BlobRef | None]:
    """Evaluate, export and store a round's model, updates and teacher; its record, the teacher's address.

    decisions, the devices' latest word decisions, calibrate the ONNX model's threshold if given.
    """
    metadata = {"round": str(round)}
    if round == 0:
        metadata[FIRST_MODEL_KEY] = model.made_from(arrays)
    if tally.privacy is not None:
        metadata |= {"dp_epsilon": repr(tally.privacy.epsilon), "dp_delta": repr(tally.privacy.delta)}
    blob = weights.encode(arrays, metadata=metadata)
    evaluation = model.evaluate(arrays)
    onnx = model.to_onnx(arrays, round, decisions)
    pair = onnx.pair
    finished = time.time()
    record = RoundRecord(
        round=round,
        started_at=tally.started,
        finished_at=finished,
        wall_s=finished - tally.started,
        devices=tally.devices,
        results=len(tally.updates),
        accuracy=evaluation.accuracy if evaluation else None,
        macro_f1=evaluation.macro_f1 if evaluation else None,
        loss=evaluation.loss if evaluation else None,
        bytes_up=tally.bytes_up,
        bytes_down=tally.bytes_down,
        weights_sha256=weights.sha256(blob),
        onnx_sha256=weights.sha256(onnx.model),
        withdrawn=tally.withdrawn,
        stragglers=tally.stragglers,
        dp_epsilon=tally.privacy.epsilon if tally.privacy else None,
        dp_delta=tally.privacy.delta if tally.privacy else None,
        frontend_sha256=weights.sha256(pair[0]) if pair else None,
        classifier_sha256=weights.sha256(pair[1]) if pair else None,
    )
    teacher_blob = weights.encode(teacher, metadata={"round": str(round)}) if teacher is not None else None
    store.save_round(record, blob, onnx.model, tally.updates, teacher_blob, pair)
    log.info(
        "round %d complete: %d/%d updates, accuracy %s, %.1f s",
        round, record.results, record.devices,
        f"{record.accuracy:.4f}" if record.accuracy is not None else "n/a", record.wall_s,
    )  # fmt: skip
    return record, teacher_address(round, teacher_blob) if teacher_blob is not None else None


def teacher_address(round: int, blob: bytes) -> BlobRef:
    """Where devices download a round's teacher model, and its digest and size."""
    return BlobRef(routes.model(round, "teacher"), weights.sha256(blob), len(blob))


def announcement(store: Store, model: ModelOps, record: RoundRecord, arrays: Arrays) -> ModelAnnouncement:
    """The announcement of a stored round's model: its spec, labels, scores and where to download it."""

    def address(kind: str, digest: str) -> BlobRef:
        size = store.model_path(record.round, kind).stat().st_size
        return BlobRef(routes.model(record.round, kind), digest, size)

    # a state folder from before the pair, or a model that does not split, has none: the one file only
    pair = (record.frontend_sha256, record.classifier_sha256)
    return ModelAnnouncement(
        round=record.round,
        spec=model.spec_of(arrays),
        labels=model.labels,
        weights=address("weights", record.weights_sha256),
        onnx=address("onnx", record.onnx_sha256) if record.onnx_sha256 else None,
        frontend=address("frontend", pair[0]) if pair[0] and pair[1] else None,
        classifier=address("classifier", pair[1]) if pair[0] and pair[1] else None,
        metrics={k: v for k in ("accuracy", "macro_f1", "loss") if (v := getattr(record, k)) is not None},
        issued_at=record.finished_at,
    )
