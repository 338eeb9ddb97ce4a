"""The package's layout stays one a reader can hold, as docs/architecture.md describes it.

Read from the source: no module of ``bot`` too long to read in one sitting, few loose
modules at ``bot``'s root, every root module and package named in the architecture's
layout, and no channel found by name at run time (each is imported where it is used).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOT = ROOT / "bot"

MAX_LINES = 650
MAX_ROOT_MODULES = 8


def _modules() -> list[Path]:
    return sorted(BOT.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(BOT).as_posix()


def test_no_module_is_too_long_to_hold() -> None:
    long = {
        _name(path): lines
        for path in _modules()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, long


def _root_modules() -> list[str]:
    return sorted(path.stem for path in BOT.glob("*.py") if path.stem != "__init__")


def _packages() -> list[str]:
    return sorted(path.parent.name for path in BOT.glob("*/__init__.py"))


def test_few_loose_modules_at_the_root() -> None:
    assert len(_root_modules()) <= MAX_ROOT_MODULES, _root_modules()


def test_the_architecture_names_every_root_module_and_package() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    layout = text.split("## Layout", 1)[1]
    named = set(re.findall(r"^  ([a-z_]+)(?:/|\.py)\s", layout, flags=re.MULTILINE))
    assert set(_root_modules()) | set(_packages()) == named


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_module_imports_a_list_of_every_channel() -> None:
    # A list of the kinds that each platform imports back for its own: every platform
    # then depends on every other one's settings, a loop no reader follows.
    importers = [
        _name(path)
        for path in _modules()
        if any(name.startswith("bot.channels.registry") for name in _imports(path))
    ]
    assert importers == []
    assert not (BOT / "channels" / "registry.py").exists()


def test_nothing_is_imported_by_a_name_built_at_run_time() -> None:
    dynamic = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                called = node.func
                name = (
                    called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
                )
                if name in {"import_module", "__import__"}:
                    dynamic.append(f"{_name(path)}:{node.lineno}")
    assert dynamic == []
