"""The packages of ``bot`` depend on each other one way (docs/architecture.md).

Read from the source, every import counted (those under ``TYPE_CHECKING`` and
inside functions too): a cycle between two packages, or the turn package reaching
up into channels, HTTP or the configuration, fails here before it spreads.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

BOT = Path(__file__).resolve().parents[1] / "bot"


def _package_of(path: Path) -> str:
    """``channels`` for bot/channels/slack/api.py, ``config`` for bot/config.py."""
    relative = path.relative_to(BOT)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def package_imports() -> dict[str, dict[str, set[str]]]:
    """package -> imported package -> the files that import it."""
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in BOT.rglob("*.py"):
        source = _package_of(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "bot" and len(parts) > 1 and parts[1] != source:
                    found[source][parts[1]].add(str(path.relative_to(BOT)))
    return found


def test_no_two_packages_import_each_other() -> None:
    imports = package_imports()
    cycles = sorted(
        f"{a} <-> {b}: {sorted(imports[a][b])} / {sorted(imports[b][a])}"
        for a in imports
        for b in imports[a]
        if a < b and a in imports.get(b, {})
    )
    assert cycles == []


def test_the_turn_package_reaches_down_only() -> None:
    reached = package_imports()["turns"]
    assert not {"channels", "http", "config", "app", "cli", "doctor"} & set(reached), {
        name: sorted(files) for name, files in reached.items()
    }
