"""The HTTP API's paths, defined once: Flask rules for the coordinator, path builders for everyone else.

A path that arrives in a message is accepted only in exactly the form built here, and joined to the
coordinator's URL only if the result stays on its host and port.
"""

import re
from urllib.parse import urlsplit

PREFIX = "/api"

# Flask rules, relative to PREFIX
TASK_RULE = "/task"
DEVICES_RULE = "/devices"
DEVICE_RULE = "/devices/<device_id>"
MODEL_RULE = "/models/<int:round>/<any(weights, float16, onnx, teacher, frontend, classifier):kind>"
LATEST_MODEL_RULE = "/models/latest"
UPDATES_RULE = "/rounds/<int:round>/updates"
EVALUATIONS_RULE = "/rounds/<int:round>/evaluations"
RELAY_RULE = "/rounds/<int:round>/relays/<int:step>"
# a secure-sum round's phases: a device posts its message, then gets the phase's outcome once it closes
SECURE_SUM_RULE = "/rounds/<int:round>/secure/<any(adverts, shares, masked, unmasking):phase>"
STATUS_RULE = "/status"
ROUNDS_RULE = "/rounds"
ROUND_RULE = "/rounds/<int:round>"
KEY_RULE = "/key"  # the public key tasks and announcements are signed with: {"coordinator_key": base64}
VALIDATION_RULE = "/validation"  # clips a device chose to share for quality-weighted aggregation
OVERVIEW_RULE = "/overview"  # devices, rounds and the model at a glance: the dashboard and `fedspeech status`
ACK_RULE = "/tasks/<task_id>/ack"  # a device took its task (with its token): its round waits for its result
# a device could not do its task (with its token, and why): its round stops waiting for it
FAILURE_RULE = "/tasks/<task_id>/failure"
# the latest model announcement, signed as on the broker: what a listener checks a retained one against
ANNOUNCEMENT_RULE = "/models/announcement"
OPENAPI_RULE = "/openapi.json"  # this API described, as an OpenAPI 3.1 document

TASK = PREFIX + TASK_RULE
DEVICES = PREFIX + DEVICES_RULE
STATUS = PREFIX + STATUS_RULE
KEY = PREFIX + KEY_RULE
VALIDATION = PREFIX + VALIDATION_RULE
OVERVIEW = PREFIX + OVERVIEW_RULE
ANNOUNCEMENT = PREFIX + ANNOUNCEMENT_RULE


MODEL_KINDS = ("weights", "float16", "onnx", "teacher", "frontend", "classifier")


def model(round: int, kind: str) -> str:
    """A completed round's model: kind weights (safetensors), float16 (in half), onnx, teacher, or the
    ONNX model's two graphs, frontend and classifier.
    """
    if kind not in MODEL_KINDS:
        raise ValueError(f"kind must be one of {', '.join(MODEL_KINDS)}, got {kind!r}")
    return f"{PREFIX}/models/{round}/{kind}"


def device(device_id: str) -> str:
    """A device known to the coordinator, as the operator revokes it."""
    return f"{DEVICES}/{device_id}"


def ack(task_id: str) -> str:
    """Where a device acknowledges that it took a task."""
    return f"{PREFIX}/tasks/{task_id}/ack"


def failure(task_id: str) -> str:
    """Where a device reports that it could not do a task, and why."""
    return f"{PREFIX}/tasks/{task_id}/failure"


def updates(round: int) -> str:
    """Where devices upload their trained weights for a round."""
    return f"{PREFIX}/rounds/{round}/updates"


def evaluations(round: int) -> str:
    """Where devices upload their evaluation of a round's model."""
    return f"{PREFIX}/rounds/{round}/evaluations"


def secure_sum(round: int, phase: str) -> str:
    """A phase of a round's secure sum: adverts, shares, masked or unmasking."""
    return f"{PREFIX}/rounds/{round}/secure/{phase}"


def relay(round: int, step: int) -> str:
    """An update a round passes on inside a group of devices trained one after another, by its step."""
    return f"{PREFIX}/rounds/{round}/relays/{step}"


_MODEL_PATH = re.compile(rf"^{PREFIX}/models/(\d{{1,9}})/(weights|float16|onnx|teacher|frontend|classifier)$")
_ROUND_PATH = re.compile(rf"^{PREFIX}/rounds/(\d{{1,9}})/(updates|evaluations)$")
_RELAY_PATH = re.compile(rf"^{PREFIX}/rounds/(\d{{1,9}})/relays/(\d{{1,9}})$")


def model_round(path: str, kind: str) -> int:
    """The round of a path of exactly model(round, kind)'s form; ValueError for any other path."""
    match = _MODEL_PATH.match(path)
    if match is None or match[2] != kind or path != model(int(match[1]), kind):
        raise ValueError(f"not the path of a round's {kind}: {path[:80]!r}")
    return int(match[1])


def result_round(path: str, kind: str) -> int:
    """The round of a path of exactly updates(round)'s or evaluations(round)'s form; ValueError otherwise."""
    match = _ROUND_PATH.match(path)
    if match is None or match[2] != kind or path != f"{PREFIX}/rounds/{int(match[1])}/{kind}":
        raise ValueError(f"not the path of a round's {kind}: {path[:80]!r}")
    return int(match[1])


def relay_round(path: str) -> int:
    """The round of a path of exactly relay(round, step)'s form; ValueError for any other path."""
    match = _RELAY_PATH.match(path)
    if match is None or path != relay(int(match[1]), int(match[2])):
        raise ValueError(f"not the path of a round's relayed update: {path[:80]!r}")
    return int(match[1])


def url(base_url: str, path: str) -> str:
    """base_url joined with an absolute API path; ValueError if the result leaves base_url's host and port."""
    if not path.startswith(PREFIX + "/") or any(c in path for c in "?#@\\%") or ".." in path:
        raise ValueError(f"not a path of the coordinator's API: {path[:80]!r}")
    joined = base_url.rstrip("/") + path
    base, result = urlsplit(base_url), urlsplit(joined)
    if (result.scheme, result.netloc) != (base.scheme, base.netloc) or base.scheme not in ("http", "https"):
        raise ValueError(f"{path[:80]!r} does not stay on the coordinator {base_url}")
    return joined
