"""What a fleet learns: task files (TOML), the built-in task of each bundled corpus, and its model spec."""

import tomllib
from pathlib import Path

from fedspeech.models.architectures import MAX_DEPTH, MODELS, TRANSFORMERS
from fedspeech.protocol.bounds import ProtocolError
from fedspeech.protocol.labels import NONE_LABEL, none_class
from fedspeech.protocol.message_checks import check_definition
from fedspeech.protocol.messages import ModelSpec, TaskDefinition

FSDD_LABELS = [str(digit) for digit in range(10)]
EMODB_LABELS = ["anger", "boredom", "disgust", "fear", "happiness", "sadness", "neutral"]
SPEECH_COMMANDS_LABELS = [
    "yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go", "_unknown_", "_silence_",
]  # fmt: skip

BACKGROUND_NOISE = "_background_noise_"  # the bundled folder of noise clips, in the data folder

# one per bundled corpus; EmoDB's utterances are 2-4 s long, so its clips are 3 s. FSDD's digits keep
# indices 0-9, the none class its background noise trains comes after them
BUILTIN_TASKS: dict[str, TaskDefinition] = {
    "fsdd": TaskDefinition("fsdd", [*FSDD_LABELS, NONE_LABEL], 8000, 1.0, [BACKGROUND_NOISE]),
    "emodb": TaskDefinition("emodb", EMODB_LABELS, 16000, 3.0),
    "speech_commands": TaskDefinition("speech_commands", SPEECH_COMMANDS_LABELS, 16000, 1.0),
}

# the model a task trains unless told otherwise: emotion lives partly in loudness, which the CNN's
# per-utterance normalisation removes
DEFAULT_MODELS = {"emodb": "emotion_cnn"}


def default_model(definition: TaskDefinition) -> str:
    """The architecture a task trains by default: its entry in DEFAULT_MODELS, else the CNN."""
    return DEFAULT_MODELS.get(definition.name, "cnn")


_KEYS = {"name": str, "labels": list, "sample_rate": int, "clip_seconds": float}
_OPTIONAL_KEYS = {"negatives": list, "say": dict}


class TaskFileError(ValueError):
    """A task file that cannot be used; the text is one line naming the file, the key and the problem."""


def load_task(name_or_path: str | Path) -> TaskDefinition:
    """A built-in task by name (fsdd, emodb, speech_commands), or a task file; TaskFileError if it is bad."""
    if str(name_or_path) in BUILTIN_TASKS:
        return BUILTIN_TASKS[str(name_or_path)]
    path = Path(name_or_path)
    try:
        document = tomllib.loads(path.read_text())
    except FileNotFoundError:
        builtin = ", ".join(BUILTIN_TASKS)
        raise TaskFileError(f"{path}: no such task file, nor a built-in task ({builtin})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFileError(f"{path}: cannot read it: {exc}") from None
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:
        raise TaskFileError(f"{path}: not valid TOML: {exc}"[:300]) from None
    return task_from_mapping(document, str(path))


def task_from_mapping(document: dict, where: str = "task") -> TaskDefinition:
    """Check a task's keys and types, then its values; TaskFileError names the key and the problem.

    A task with negatives gets NONE_LABEL as its last label, unless it has a none class already.
    """
    keys = {**_KEYS, **_OPTIONAL_KEYS}
    unknown = sorted(set(document) - set(keys))
    if unknown:
        raise TaskFileError(f"{where}: unknown key {unknown[0]!r}; a task has {', '.join(keys)}")
    for key, kind in keys.items():
        if key not in document:
            if key in _OPTIONAL_KEYS:
                continue
            raise TaskFileError(f"{where}: key {key!r} is missing")
        value = document[key]
        numeric = kind is float and isinstance(value, int) and not isinstance(value, bool)
        if not (isinstance(value, kind) and not isinstance(value, bool)) and not numeric:
            raise TaskFileError(f"{where}: key {key!r} must be {_TYPE_NAMES[kind]}, got {_shown(value)}")
    for key in ("labels", "negatives"):
        if not all(isinstance(item, str) for item in document.get(key, [])):
            shown = _shown(document[key])
            raise TaskFileError(f"{where}: key {key!r} must be a list of strings, got {shown}")
    for key in ("sample_rate", "clip_seconds"):
        if abs(document[key]) > 2**53:  # as in messages; larger ones overflow float() and str()
            raise TaskFileError(f"{where}: key {key!r} is out of range")
    seconds = float(document["clip_seconds"])
    labels, negatives = list(document["labels"]), list(document.get("negatives", []))
    if negatives and none_class(labels) is None:
        labels.append(NONE_LABEL)
    say = document.get("say", {})
    if not all(isinstance(text, str) for text in say.values()):
        raise TaskFileError(f"{where}: key 'say' must be a table of label = \"words\", got {_shown(say)}")
    definition = TaskDefinition(document["name"], labels, document["sample_rate"], seconds, negatives, say)
    try:
        check_definition(definition)
    except ProtocolError as exc:
        raise TaskFileError(f"{where}: key {exc}") from None
    return definition


def _shown(value: object) -> str:
    """repr of a value for a message, even of an integer too long to print."""
    try:
        return repr(value)[:100]
    except ValueError:
        return "a number too large to show"


_TYPE_NAMES = {
    str: "a string", list: "a list of strings", int: "a whole number", float: "a number", dict: "a table",
}  # fmt: skip


def spec_for(definition: TaskDefinition, name: str | None = None, depth: int | None = None) -> ModelSpec:
    """The model spec a task trains: its rate, clip length and number of labels.

    name None is the task's default model. A transformer's depth (its full-grown depth when it grows)
    defaults to MAX_DEPTH; a CNN has none.
    """
    name = default_model(definition) if name is None else name
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}, expected one of {MODELS}")
    if name in TRANSFORMERS:
        depth = MAX_DEPTH if depth is None else depth
        if not 1 <= depth <= MAX_DEPTH:
            raise ValueError(f"depth must be between 1 and {MAX_DEPTH}, got {depth}")
    else:
        depth = None
    return ModelSpec(name, definition.sample_rate, definition.num_samples, len(definition.labels), depth)
