"""ONNX templates kept from one run to the next: exporting a model's graphs takes seconds, swapping their
weights (onnx_weights.update_onnx_weights) none.

A template is what a model spec exports to: its one file and its pair. It is kept in the user's cache
folder (systemd's CACHE_DIRECTORY, else XDG_CACHE_HOME, else ~/.cache) under a digest of all that makes
the graph: the spec, the labels and their spoken forms, the versions of torch and the ONNX libraries and
the source of fedspeech's model and export code, so that a change to any of them exports anew.
"""

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from fedspeech.models.cache_key import cache_key
from fedspeech.protocol.messages import ModelSpec

log = logging.getLogger(__name__)

MANIFEST = "templates.json"  # in a kept template's folder: its files by kind
LIBRARIES = ("torch", "onnx", "onnxscript", "onnx-ir")  # whose versions shape an exported graph


def cache_root() -> Path:
    """Where this user's templates are kept."""
    if systemd := os.environ.get("CACHE_DIRECTORY"):  # a unit's CacheDirectory= (the first, if several)
        return Path(systemd.split(":")[0]) / "onnx-templates"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fedspeech" / "onnx-templates"


def _source_digest() -> str:
    """A digest of the code an exported graph comes from: fedspeech's models and export packages."""
    import fedspeech.export
    import fedspeech.models

    digest = hashlib.sha256()
    for package in (fedspeech.models, fedspeech.export):
        folder = Path(package.__path__[0])
        for path in sorted(folder.rglob("*.py")):
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def template_key(spec: ModelSpec, labels: Sequence[str], task: str, say: Mapping[str, str]) -> str:
    """The digest a spec's templates are kept under."""
    versions = {name: importlib.metadata.version(name) for name in LIBRARIES}
    made_of = {"spec": asdict(spec), "labels": list(labels), "task": task, "say": dict(say)}
    return cache_key(made_of | {"versions": versions, "source": _source_digest()})


def _kept(folder: Path) -> dict[str, Path] | None:
    """The templates kept in folder, by kind; None if it holds none or lacks a file."""
    try:
        names = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    paths = {kind: folder / name for kind, name in names.items()}
    return paths if all(path.is_file() for path in paths.values()) else None


def kept_templates(key: str, export: Callable[[Path], dict[str, Path]], fallback: Path) -> dict[str, Path]:
    """The templates kept under key; else export(folder) into the cache, kept there for the next run.

    Where the cache cannot be written, export into fallback (made if need be), kept for this run only.
    Two processes that export the same templates at once each use their own; the first to finish keeps its.
    """
    root = cache_root()
    if (found := _kept(root / key)) is not None:
        return found
    try:
        root.mkdir(parents=True, exist_ok=True)
        part = Path(tempfile.mkdtemp(prefix=f"{key}.part-", dir=root))
    except OSError as exc:
        log.info("ONNX templates are not kept for the next run (%s): exported here, for this run", exc)
        fallback.mkdir(parents=True, exist_ok=True)
        return export(fallback)
    try:
        made = export(part)
        kinds = {kind: path.relative_to(part).as_posix() for kind, path in made.items()}
        (part / MANIFEST).write_text(json.dumps(kinds))
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    if (root / key).exists() and _kept(root / key) is None:  # a kept folder that lacks a file
        shutil.rmtree(root / key, ignore_errors=True)
    try:
        part.rename(root / key)
    except OSError:  # another process kept the same templates first: theirs are used, these dropped
        if (found := _kept(root / key)) is not None:
            shutil.rmtree(part, ignore_errors=True)
            return found
        return made
    return {kind: root / key / name for kind, name in kinds.items()}
