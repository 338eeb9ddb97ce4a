"""``bench/`` stays a small toolbox that runs from the package alone.

Its scripts import each other as siblings (``import harness``) and the service from ``bot``
(test doubles from ``bot.testing``), never from ``tests/``: a benchmark must run from a
checkout whatever the tests look like. A name a script takes from the harness must exist
there, so that a script nobody has run lately still starts.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
MAX_LINES = 2600


def scripts() -> dict[str, ast.Module]:
    return {path.name: ast.parse(path.read_text()) for path in sorted(BENCH.glob("*.py"))}


def test_bench_is_small() -> None:
    lines = {path.name: len(path.read_text().splitlines()) for path in BENCH.glob("*.py")}
    assert sum(lines.values()) <= MAX_LINES, sorted(lines.items(), key=lambda kv: -kv[1])


def test_bench_imports_nothing_from_tests() -> None:
    found = []
    for name, tree in scripts().items():
        for node in ast.walk(tree):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            found += [f"{name}: {m}" for m in modules if m.split(".")[0] == "tests"]
    assert found == []


def test_every_name_taken_from_a_sibling_exists_there() -> None:
    trees = scripts()
    defined = {
        name.removesuffix(".py"): {
            target.id if isinstance(target, ast.Name) else target.name
            for node in tree.body
            for target in (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else [node]
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                else []
            )
            if isinstance(target, ast.Name | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        for name, tree in trees.items()
    }
    missing = []
    for name, tree in trees.items():
        siblings = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
            if alias.name in defined
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in defined:
                taken = [(node.module, alias.name) for alias in node.names]
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in siblings
            ):
                taken = [(node.value.id, node.attr)]
            else:
                continue
            missing += [f"{name}: {m}.{n}" for m, n in taken if n not in defined[m]]
    assert missing == []
