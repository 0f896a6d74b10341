"""Range checks of a decoded message's values that its types alone do not express; ProtocolError says why."""

import base64
import binascii
import math
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from fedspeech.protocol import routes
from fedspeech.protocol.bounds import (
    DECISION_BINS,
    MAX_BATCH_SIZE,
    MAX_BLOB_BYTES,
    MAX_CLIP_SECONDS,
    MAX_CONFIG,
    MAX_COUNT,
    MAX_DEPTH,
    MAX_EPOCHS,
    MAX_LABELS,
    MAX_LEARNING_RATE,
    MAX_NEGATIVE_CHARS,
    MAX_NEGATIVES,
    MAX_TASK_SECONDS,
    MIN_CLIP_SECONDS,
    NAME,
    SAMPLE_RATES,
    SHA256,
    TASK_ID,
    ProtocolError,
)
from fedspeech.protocol.labels import is_word, none_class

if TYPE_CHECKING:
    from fedspeech.protocol.messages import (
        BlobRef,
        EvaluationReport,
        ModelAnnouncement,
        ModelSpec,
        Profile,
        SecureSum,
        Task,
        TaskDefinition,
        TaskFailure,
        TaskWithdrawal,
    )

MAX_SPOKEN_CHARS = 100  # how a label is said
SPOKEN = re.compile(rf"[^\W\d_][^\W_]*(?:['\- ][^\W_]+){{0,{MAX_SPOKEN_CHARS // 2}}}")
MAX_SECURE_DEVICES = 255  # Shamir's shares are numbered within a byte
MAX_SECURE_CLIP = 1e6
MAX_WITHDRAWN = 64  # task ids one withdrawal names
MAX_FAILURE_CHARS = 300  # of the reason a device gives for a task it could not do: one line of a log
MAX_TIME = 2.0**40  # bound on a message's Unix time, some 35,000 years from 1970


def check_definition(definition: "TaskDefinition") -> None:
    """ProtocolError unless the task's name, labels, rate and clip length are usable and bounded."""
    if not NAME.match(definition.name):
        raise ProtocolError(
            f"name: {definition.name!r}: use ASCII letters, digits, '_', '.' or '-' (at most 64)"
        )
    labels = definition.labels
    if not 2 <= len(labels) <= MAX_LABELS:
        raise ProtocolError(f"labels: between 2 and {MAX_LABELS} are needed, got {len(labels)}")
    for label in labels:
        if not NAME.match(label):
            raise ProtocolError(
                f"labels: {label!r} is not a folder name (ASCII letters, digits, '_', '.', '-')"
            )
    if len(set(labels)) != len(labels):
        raise ProtocolError(f"labels: repeated {sorted({x for x in labels if labels.count(x) > 1})}")
    low, high = SAMPLE_RATES
    if not low <= definition.sample_rate <= high:
        raise ProtocolError(f"sample_rate: must be between {low} and {high} Hz, got {definition.sample_rate}")
    seconds = definition.clip_seconds
    if not (math.isfinite(seconds) and MIN_CLIP_SECONDS <= seconds <= MAX_CLIP_SECONDS):
        limits = f"{MIN_CLIP_SECONDS} and {MAX_CLIP_SECONDS}"
        raise ProtocolError(f"clip_seconds: must be between {limits}, got {seconds}")
    _check_negatives(definition.negatives, labels)
    _check_say(definition.say, labels)


def _check_say(say: Mapping[str, str], labels: list[str]) -> None:
    """ProtocolError unless each entry says a word label of the task in a short line of words."""
    if not isinstance(say, Mapping):
        raise ProtocolError("say: must be a table of label = words")
    for label, text in say.items():
        if label not in labels or not is_word(label):
            raise ProtocolError(f"say: {label[:64]!r} is not a word label of the task")
        if not (isinstance(text, str) and len(text) <= MAX_SPOKEN_CHARS and SPOKEN.fullmatch(text)):
            raise ProtocolError(
                f"say: {label}: {str(text)[:64]!r} must be words (letters, digits, single spaces, ' and -), "
                f"at most {MAX_SPOKEN_CHARS} characters"
            )


def _check_negatives(negatives: list[str], labels: list[str]) -> None:
    """ProtocolError unless each negative is a short relative path inside a data folder, not a label's."""
    if len(negatives) > MAX_NEGATIVES:
        raise ProtocolError(f"negatives: at most {MAX_NEGATIVES}, got {len(negatives)}")
    if negatives and none_class(labels) is None:
        raise ProtocolError("negatives: they train a none class, and the labels have no _none_ or _silence_")
    for negative in negatives:
        path = PurePosixPath(negative)
        if not (0 < len(negative) <= MAX_NEGATIVE_CHARS and negative.isprintable()):
            limit = f"1 to {MAX_NEGATIVE_CHARS} printable characters"
            raise ProtocolError(f"negatives: {negative[:40]!r} must be {limit}")
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise ProtocolError(f"negatives: {negative!r} must be a path inside the data folder, no '..'")
        if path.parts[0] in labels:
            raise ProtocolError(f"negatives: {negative!r} is in the folder of label {path.parts[0]!r}")


def _check_size(ref: "BlobRef", kind: str) -> None:
    if not SHA256.match(ref.sha256) or not 0 < ref.size <= MAX_BLOB_BYTES:
        raise ProtocolError(f"bad {kind} reference: sha256 of 64 hex digits, size 1 to {MAX_BLOB_BYTES}")


def _check_blob(ref: "BlobRef", kind: str) -> int:
    """The round a blob of a kind (routes.MODEL_KINDS) belongs to; ProtocolError unless it is well formed."""
    _check_size(ref, kind)
    try:
        return routes.model_round(ref.path, kind)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None


def _check_weights(task: "Task") -> None:
    """ProtocolError unless a task trains a global model of its round or before, or one relayed in it."""
    ref = task.weights
    if not ref.path.startswith(routes.PREFIX + "/rounds/"):
        if _check_blob(ref, "float16" if task.precision == "float16" else "weights") > task.round:
            raise ProtocolError("a task's weights must come from its round or an earlier one")
        return
    _check_size(ref, "relay")
    try:
        relay_round = routes.relay_round(ref.path)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    if relay_round != task.round:
        raise ProtocolError(f"an update relayed in round {relay_round} in a task of round {task.round}")


def check_task(task: "Task") -> None:
    """ProtocolError unless a task's numbers are bounded and its weights, teacher and upload fit its round."""
    if not (1 <= task.epochs <= MAX_EPOCHS and 1 <= task.batch_size <= MAX_BATCH_SIZE):
        raise ProtocolError(f"epochs must be 1 to {MAX_EPOCHS} and batch_size 1 to {MAX_BATCH_SIZE}")
    if not (math.isfinite(task.learning_rate) and 0 < task.learning_rate <= MAX_LEARNING_RATE):
        raise ProtocolError(f"learning_rate must be above 0 and at most {MAX_LEARNING_RATE}")
    if not math.isfinite(task.deadline):
        raise ProtocolError("deadline must be a finite time")
    # the model trained in a round is the one the previous round produced; an evaluation, the round's own;
    # inside a group trained one device after another, the update of the device before
    _check_weights(task)
    if task.teacher is not None and _check_blob(task.teacher, "teacher") > task.round:
        raise ProtocolError("a task's teacher must come from its round or an earlier one")
    kind = "updates" if task.action == "train" else "evaluations"
    try:
        upload_round = routes.result_round(task.upload_path, kind)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    if upload_round != task.round:
        raise ProtocolError(f"upload path of round {upload_round} in a task of round {task.round}")
    _check_config(task.config)
    if task.secure_sum is not None:
        check_secure_sum(task.secure_sum)


def is_public_key(text: str) -> bool:
    """Whether text is 32 bytes in base64, as an Ed25519 public key is written."""
    try:
        return len(text) <= 64 and len(base64.b64decode(text, validate=True)) == 32
    except (binascii.Error, ValueError):
        return False


def check_secure_sum(secure: "SecureSum") -> None:
    """ProtocolError unless a task's secure-sum settings make a sum that can be rebuilt and not wrap."""
    if not 2 <= secure.threshold <= secure.devices <= MAX_SECURE_DEVICES:
        raise ProtocolError(f"a secure sum needs 2 <= threshold <= devices <= {MAX_SECURE_DEVICES}")
    if not (math.isfinite(secure.clip) and 0 < secure.clip <= MAX_SECURE_CLIP):
        raise ProtocolError(f"a secure sum's clip must be above 0 and at most {MAX_SECURE_CLIP:g}")
    if not (math.isfinite(secure.noise) and 0 <= secure.noise <= MAX_SECURE_CLIP):
        raise ProtocolError(f"a secure sum's noise must be at least 0 and at most {MAX_SECURE_CLIP:g}")
    if not (math.isfinite(secure.count_scale) and 0 <= secure.count_scale <= MAX_SECURE_CLIP):
        raise ProtocolError(f"a secure sum's count scale must be at least 0 and at most {MAX_SECURE_CLIP:g}")
    if not 0 < secure.weight <= 1:
        raise ProtocolError("a device's weight in a secure sum must be above 0 and at most 1")
    if not 0 < secure.unmask_s <= MAX_TASK_SECONDS:
        raise ProtocolError(
            f"a secure sum's unmasking time must be above 0 and at most {MAX_TASK_SECONDS:g} s"
        )


def check_announcement(announcement: "ModelAnnouncement") -> None:
    """ProtocolError unless an announcement's files are of its round and its labels and metrics bounded."""
    if (announcement.frontend is None) != (announcement.classifier is None):
        raise ProtocolError("an announcement names both graphs of a pair (frontend, classifier) or neither")
    optional = [("onnx", announcement.onnx), ("frontend", announcement.frontend)]
    optional.append(("classifier", announcement.classifier))
    refs = [("weights", announcement.weights)] + [(kind, ref) for kind, ref in optional if ref is not None]
    for kind, ref in refs:
        if _check_blob(ref, kind) != announcement.round:
            raise ProtocolError(
                f"the {kind} of another round in the announcement of round {announcement.round}"
            )
    if not 2 <= len(announcement.labels) <= MAX_LABELS or not all(NAME.match(x) for x in announcement.labels):
        raise ProtocolError(f"labels: 2 to {MAX_LABELS} names of ASCII letters, digits, '_', '.', '-'")
    if len(announcement.metrics) > MAX_CONFIG:
        raise ProtocolError(f"more than {MAX_CONFIG} metrics")
    _check_config(announcement.metrics)
    if not 0 <= announcement.issued_at <= MAX_TIME:
        raise ProtocolError(f"issued_at must be a time between 0 and {MAX_TIME:.0f}")


def check_withdrawal(withdrawal: "TaskWithdrawal") -> None:
    """ProtocolError unless a withdrawal names a bounded number of task ids."""
    ids = withdrawal.task_ids
    if len(ids) > MAX_WITHDRAWN or not all(TASK_ID.match(task_id) for task_id in ids):
        raise ProtocolError(f"a withdrawal names at most {MAX_WITHDRAWN} task ids")


def check_failure(failure: "TaskFailure") -> None:
    """ProtocolError unless a failure report gives a reason of 1 to MAX_FAILURE_CHARS characters."""
    if not 0 < len(failure.reason) <= MAX_FAILURE_CHARS:
        raise ProtocolError(f"reason: 1 to {MAX_FAILURE_CHARS} characters, got {len(failure.reason)}")


def check_spec(spec: "ModelSpec") -> None:
    """ProtocolError unless a model spec names an architecture and sizes within the bounds."""
    low, high = SAMPLE_RATES
    if (
        not NAME.match(spec.name)
        or not low <= spec.sample_rate <= high
        or not 2 <= spec.num_classes <= MAX_LABELS
    ):
        raise ProtocolError(f"bad model spec {spec}")
    if not 1 <= spec.num_samples <= high * MAX_CLIP_SECONDS or not (
        spec.depth is None or 1 <= spec.depth <= MAX_DEPTH
    ):
        raise ProtocolError(f"bad model spec {spec}")


def check_profile(profile: "Profile") -> None:
    """ProtocolError unless a profile's values are within the bounds."""
    values = [profile.cpu_freq_mhz, profile.ram_available_mb, profile.cpu_gflops, profile.seconds_per_sample]
    values.append(profile.rtt_ms)
    if not 1 <= profile.cpu_count <= 4096 or any(v is not None and not 0 <= v <= 1e9 for v in values):
        raise ProtocolError("profile values out of range")


def _check_config(config: Mapping[str, float | list[float]]) -> None:
    if len(config) > MAX_CONFIG:
        raise ProtocolError(f"config has {len(config)} settings, more than {MAX_CONFIG}")
    for name, value in config.items():
        values = value if isinstance(value, list) else [value]
        if not NAME.match(name) or len(values) > MAX_LABELS or not all(math.isfinite(v) for v in values):
            raise ProtocolError(f"bad config setting {name!r}: {str(value)[:80]}")


def check_counts(counts: dict[str, int]) -> None:
    """ProtocolError unless the clip counts per label are bounded and keyed by names."""
    if len(counts) > MAX_LABELS:
        raise ProtocolError(f"counts for {len(counts)} labels, more than {MAX_LABELS}")
    for label, count in counts.items():
        if not NAME.match(label) or not 0 <= count <= MAX_COUNT:
            raise ProtocolError(f"bad count {count!r} for label {label!r}")


def check_confusion(report: "EvaluationReport") -> None:
    """ProtocolError unless an evaluation's confusion matrix is square and bounded and its loss finite."""
    size = len(report.confusion)
    if not 2 <= size <= MAX_LABELS or any(len(row) != size for row in report.confusion):
        raise ProtocolError(f"confusion must be a square matrix of 2 to {MAX_LABELS} classes")
    if any(not 0 <= count <= MAX_COUNT for row in report.confusion for count in row):
        raise ProtocolError(f"confusion counts must be between 0 and {MAX_COUNT}")
    if not (math.isfinite(report.loss_sum) and report.loss_sum >= 0):
        raise ProtocolError("loss_sum must be a finite number, not negative")
    if report.decisions is not None:
        if len(report.decisions) != 2 or any(len(row) != DECISION_BINS for row in report.decisions):
            raise ProtocolError(f"decisions must be 2 rows of {DECISION_BINS} counts")
        if any(not 0 <= count <= MAX_COUNT for row in report.decisions for count in row):
            raise ProtocolError(f"decision counts must be between 0 and {MAX_COUNT}")
