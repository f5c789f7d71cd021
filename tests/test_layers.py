"""The layer rules of the package (README, "Layout"): every import of a harness module stays in
its layer or goes down to one `ALLOWED` names, so the layers form no cycle; and no two modules
import each other, however indirectly.

Layers, top to bottom: fronts; run; report; impls; check, verdict; checkpoint, model; base
(`harness.errors`, `harness.results`, `harness.axes`, `harness.rank_context`).  What each may import is `ALLOWED`.
Imports inside functions count (a cycle dodged by a late import is still a cycle);
imports under ``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "harness"
BASE = {"harness", "harness.errors", "harness.results", "harness.axes", "harness.rank_context", "harness.data",
        "harness.entry_points"}
# Front doors at the top: ``python -m harness`` and the path factories import ModelCase from.
DOORS = {"harness.__main__", "harness.module_mode", "harness.pytest_cases"}
ALLOWED = {
    "base": set(),
    "checkpoint": {"base"},
    "model": {"base"},
    "check": {"model", "base"},
    "verdict": {"model", "base"},
    "impls": {"check", "checkpoint", "model", "base"},
    "report": {"base"},
    "run": {"check", "verdict", "impls", "checkpoint", "model", "base"},
    "fronts": {"run", "report", "check", "verdict", "impls", "checkpoint", "model", "base"},
}


def layer(module: str) -> str:
    """The layer a harness module belongs to."""
    if module in DOORS:
        return "fronts"
    if module in BASE:
        return "base"
    return module.split(".")[1]


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    return skipped


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The harness modules `module` imports (anywhere in it but under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in known else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in known and name != module}


GRAPH = {name: imports(name, path, modules()) for name, path in modules().items()}


def test_the_layer_table_itself_has_no_cycle():
    def reaches(start: str, goal: str, seen: frozenset = frozenset()) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in ALLOWED[start])
    assert not [name for name in ALLOWED if reaches(name, name)]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_every_import_goes_down(module):
    upward = [f"{module} ({layer(module)}) imports {target} ({layer(target)})" for target in sorted(GRAPH[module])
              if layer(target) != layer(module) and layer(target) not in ALLOWED[layer(module)]]
    assert not upward, "\n".join(upward)


def test_no_two_modules_import_each_other_through_any_path():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for name in GRAPH:
        if name not in index:
            visit(name)
    assert not cycles, cycles


def test_the_rules_can_fail():
    """The checks see an upward import (a control: the walker must read relative imports)."""
    assert "harness.run.runner" in GRAPH["harness.run.execution"]
    assert layer("harness.run.execution") == "run" and "fronts" not in ALLOWED["run"]
