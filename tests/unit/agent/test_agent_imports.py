"""The node agent sits below the control plane: none of its modules imports the job manager, the
scheduler, the operator or the CLI, and its modules import each other one way (no circle, not
even through an import inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

AGENT = Path(__file__).resolve().parents[3] / "src" / "unbroken" / "agent"
ABOVE = ("manager", "scheduler", "operator", "cli", "compat")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports of this project, at any depth of its code."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in out if m.split(".")[0] == "unbroken"}


def _agent_modules() -> dict[str, set[str]]:
    modules = {f"unbroken.agent.{p.stem}": p for p in AGENT.glob("*.py") if p.stem != "__init__"}
    return {name: _imports(path) & set(modules) for name, path in modules.items()}


def test_the_agent_imports_nothing_above_it() -> None:
    upward = {
        f"{path.name}: {module}"
        for path in AGENT.glob("*.py")
        for module in _imports(path)
        if module.split(".")[1] in ABOVE
    }
    assert upward == set()


def test_the_agent_modules_import_each_other_without_a_circle() -> None:
    graph = _agent_modules()
    assert any(graph.values())  # the check sees the imports
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for other in graph[module]:
            visit(other, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
