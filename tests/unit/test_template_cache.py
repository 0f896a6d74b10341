"""ONNX templates kept in the user's cache: exported once, found by the next run, never a stale one."""

import os
import stat

import pytest

from fedspeech.export import template_cache
from fedspeech.export.template_cache import cache_root, kept_templates, template_key
from fedspeech.protocol.messages import ModelSpec

SPEC = ModelSpec("cnn", 8000, 8000, 10)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "fedspeech" / "onnx-templates"


class Exporter:
    """Writes a template's files as the exporter would, and counts its calls."""

    def __init__(self, kinds=("model", "frontend", "classifier")):
        self.kinds, self.calls = kinds, 0

    def __call__(self, folder):
        self.calls += 1
        paths = {kind: folder / f"{kind}.onnx" for kind in self.kinds}
        for kind, path in paths.items():
            path.write_bytes(kind.encode() * 10)
        return paths


def test_a_template_is_exported_once_and_found_by_the_next_run(cache, tmp_path):
    export, key = Exporter(), template_key(SPEC, ["yes", "no"], "words", {})
    first = kept_templates(key, export, tmp_path / "fallback")
    again = kept_templates(key, export, tmp_path / "fallback")
    assert export.calls == 1 and first == again
    assert {kind: path.read_bytes() for kind, path in again.items()} == {
        k: k.encode() * 10 for k in export.kinds
    }
    assert all(path.parent == cache / key for path in again.values())
    assert [p.name for p in cache.iterdir()] == [key], "no half-made folder left behind"


def test_anything_that_shapes_the_graph_changes_the_key(cache):
    key = template_key(SPEC, ["yes", "no"], "words", {})
    others = [
        template_key(ModelSpec("cnn", 8000, 8000, 10, depth=2), ["yes", "no"], "words", {}),
        template_key(SPEC, ["no", "yes"], "words", {}),
        template_key(SPEC, ["yes", "no"], "other", {}),
        template_key(SPEC, ["yes", "no"], "words", {"yes": "yeah"}),
    ]
    assert len({key, *others}) == 5
    assert template_key(SPEC, ["yes", "no"], "words", {}) == key


def test_the_models_code_is_part_of_the_key(cache, monkeypatch):
    key = template_key(SPEC, ["yes"], "words", {})
    monkeypatch.setattr(template_cache, "_source_digest", lambda: "another version of the code")
    assert template_key(SPEC, ["yes"], "words", {}) != key


def test_a_kept_folder_that_lacks_a_file_is_exported_again(cache, tmp_path):
    export, key = Exporter(), template_key(SPEC, ["yes"], "words", {})
    kept = kept_templates(key, export, tmp_path / "fallback")
    kept["classifier"].unlink()
    again = kept_templates(key, export, tmp_path / "fallback")
    assert export.calls == 2 and all(path.is_file() for path in again.values())


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only folder")
def test_an_unwritable_cache_exports_for_this_run_only(cache, tmp_path):
    cache.parent.mkdir(parents=True)
    cache.parent.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        export = Exporter(("model",))
        made = kept_templates(template_key(SPEC, ["yes"], "words", {}), export, tmp_path / "fallback")
    finally:
        cache.parent.chmod(stat.S_IRWXU)
    assert made == {"model": tmp_path / "fallback" / "model.onnx"} and made["model"].is_file()


def test_a_cache_that_is_a_file_exports_for_this_run_only(cache, tmp_path):
    cache.parent.mkdir(parents=True)
    cache.write_text("not a folder")  # as root, the one way a cache cannot be written
    made = kept_templates(template_key(SPEC, ["yes"], "words", {}), Exporter(("model",)), tmp_path / "run")
    assert made == {"model": tmp_path / "run" / "model.onnx"} and made["model"].is_file()


def test_a_failed_export_leaves_nothing_in_the_cache(cache, tmp_path):
    def broken(folder):
        (folder / "model.onnx").write_bytes(b"half")
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError, match="export failed"):
        kept_templates(template_key(SPEC, ["yes"], "words", {}), broken, tmp_path / "fallback")
    assert list(cache.iterdir()) == []


def test_a_systemd_unit_s_cache_directory_comes_first(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("CACHE_DIRECTORY", f"{tmp_path / 'unit'}:{tmp_path / 'second'}")
    assert cache_root() == tmp_path / "unit" / "onnx-templates"
