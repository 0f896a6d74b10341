"""docs/modules.md cannot go stale: it names every package folder and every module, and nothing that is
gone, each with its docstring's first paragraph."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_map():
    """docs/module_map.py, loaded from its file (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("module_map", ROOT / "docs" / "module_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_map_names_every_package_folder():
    mapping = module_map()
    assert sorted(mapping.PACKAGES) == mapping.package_folders()


def test_the_map_is_the_tree_as_it_is():
    mapping = module_map()
    assert mapping.written() == mapping.generated(), "the tree changed: run python docs/module_map.py"


def test_every_module_says_what_it_is():
    mapping = module_map()
    missing = [
        str(path.relative_to(ROOT))
        for folder in mapping.PACKAGES
        for path in (ROOT / folder).glob("*.py")
        if path.name != "__init__.py" and not mapping.summary(path)
    ]
    assert not missing, f"modules without a docstring: {missing}"
