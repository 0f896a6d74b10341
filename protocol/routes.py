"""The HTTP API's paths, defined once: Flask rules for the coordinator, path builders for everyone else."""

PREFIX = "/api"

# Flask rules, relative to PREFIX
TASK_RULE = "/task"
DEVICES_RULE = "/devices"
MODEL_RULE = "/models/<int:round>/<any(weights, onnx):kind>"
LATEST_MODEL_RULE = "/models/latest"
UPDATES_RULE = "/rounds/<int:round>/updates"
EVALUATIONS_RULE = "/rounds/<int:round>/evaluations"
STATUS_RULE = "/status"
ROUNDS_RULE = "/rounds"
ROUND_RULE = "/rounds/<int:round>"

TASK = PREFIX + TASK_RULE
DEVICES = PREFIX + DEVICES_RULE
STATUS = PREFIX + STATUS_RULE


def model(round: int, kind: str) -> str:
    """The global model of a completed round: kind 'weights' (safetensors) or 'onnx'."""
    if kind not in ("weights", "onnx"):
        raise ValueError(f"kind must be weights or onnx, got {kind!r}")
    return f"{PREFIX}/models/{round}/{kind}"


def updates(round: int) -> str:
    """Where devices upload their trained weights for a round."""
    return f"{PREFIX}/rounds/{round}/updates"


def evaluations(round: int) -> str:
    """Where devices upload their evaluation of a round's model."""
    return f"{PREFIX}/rounds/{round}/evaluations"
