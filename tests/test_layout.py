"""The second import contract, which import-linter (it sees only the package) cannot check:
scripts/, benchmarks/ and tests/ reach the command line through `draftsmith.commands.cli.main`
alone, never the commands' internals (their classes, parsers, registry)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("scripts", "benchmarks", "tests")
ALLOWED = {("draftsmith.commands.cli", "main")}


def commands_imports(path: Path) -> list[str]:
    """`path`'s imports of draftsmith.commands (anywhere in the file, functions included) other
    than ``from draftsmith.commands.cli import main``, as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in names:
            inside = module == "draftsmith.commands" or module.startswith("draftsmith.commands.")
            imports_commands = module == "draftsmith" and name == "commands"
            if (inside or imports_commands) and (module, name) not in ALLOWED:
                found.append(f"{node.lineno}: {module}" + (f" import {name}" if name else ""))
    return found


def test_scripts_benchmarks_and_tests_use_only_the_command_lines_main():
    offenders = {
        str(path.relative_to(REPO)): found
        for folder in FOLDERS
        for path in sorted((REPO / folder).rglob("*.py"))
        if (found := commands_imports(path))
    }
    assert offenders == {}, (
        "import `from draftsmith.commands.cli import main` and run main([...]), or move what "
        f"you need below draftsmith.commands: {offenders}"
    )


def test_the_check_sees_imports_in_functions_too(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "from draftsmith.commands.cli import main\n"
        "import draftsmith.commands.bench\n"
        "def f():\n"
        "    from draftsmith.commands.cli import COMMANDS, main\n"
        "    from draftsmith import commands\n"
    )
    assert commands_imports(source) == [
        "2: draftsmith.commands.bench",
        "4: draftsmith.commands.cli import COMMANDS",
        "5: draftsmith import commands",
    ]


PRODUCT = ("draftsmith", "heads", "data", "decoding", "calibration", "train")
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300


def test_product_modules_and_classes_stay_small():
    """Small modules with one job: none over MAX_MODULE_LINES lines, no class over
    MAX_CLASS_LINES (split by job, as decoding/policies/cost_aware.py's parts are)."""
    too_long = {}
    for folder in PRODUCT:
        for path in sorted((REPO / folder).rglob("*.py")):
            source = path.read_text()
            where = str(path.relative_to(REPO))
            if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
                too_long[where] = lines
            for node in ast.walk(ast.parse(source, filename=where)):
                if isinstance(node, ast.ClassDef):
                    size = node.end_lineno - node.lineno + 1
                    if size > MAX_CLASS_LINES:
                        too_long[f"{where}::{node.name}"] = size
    assert too_long == {}, f"split these by job: {too_long}"
