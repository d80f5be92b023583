"""The wheel holds every package: a subpackage missing from pyproject's list imports in an
editable install (which maps whole folders) and fails in a regular one."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = setuptools["package-dir"]
    found = set()
    for package, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            name = ".".join((package, *parts))
            # a folder mapped on its own (draftsmith.heads -> heads/) is found from its mapping
            if not any(
                name.startswith(f"{other}.") or name == other
                for other in folders
                if len(other) > len(package)
            ):
                found.add(name)
    assert found <= listed, f"missing from [tool.setuptools] packages: {sorted(found - listed)}"
