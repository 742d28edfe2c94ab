"""The route map of one recovery (docs/recovery-route.md) names real code: every dotted name
in it resolves to a module of src/ and a class, function or method defined there. Read from the
source (ast), so the worker's and the agent's names resolve without importing torch."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src"
ROUTE = ROOT / "docs" / "recovery-route.md"
DOTTED = re.compile(r"`(unbroken(?:\.\w+)+)`")


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _module_file(parts: list[str]) -> Path | None:
    base = SRC.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _names_in(body: list[ast.stmt]) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                out[alias.asname or alias.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node
    return out


def resolve(dotted: str) -> str | None:
    """Why ``dotted`` does not name code in src/ (None: it does)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_file(parts[:cut])
        if path is None:
            continue
        rest = parts[cut:]
        body: list[ast.stmt] = _tree(path).body
        for i, name in enumerate(rest):
            found = _names_in(body).get(name)
            if found is None:
                return f"{'.'.join(parts[: cut + i])} defines no {name!r}"
            if isinstance(found, ast.ImportFrom):
                assert found.module is not None
                return resolve(".".join([found.module, *rest[i:]]))
            if isinstance(found, ast.ClassDef):
                body = found.body
            elif i < len(rest) - 1:
                return f"{name} is not a class: {'.'.join(rest[i + 1 :])} cannot be in it"
        return None
    return f"no module of src/ for {dotted}"


def test_every_name_on_the_route_map_resolves() -> None:
    names = sorted(set(DOTTED.findall(ROUTE.read_text())))
    assert len(names) > 30, "the route map names too little to follow"
    broken = {name: why for name in names if (why := resolve(name)) is not None}
    assert broken == {}


@pytest.mark.parametrize(
    "dotted",
    [
        "unbroken.manager.executor.Executor.no_such_method",
        "unbroken.manager.no_such_module.thing",
        "unbroken.worker.replica.repair.inside",
    ],
)
def test_a_name_that_is_not_in_the_code_is_found_out(dotted: str) -> None:
    assert resolve(dotted) is not None


def test_the_route_map_has_every_hop_of_a_recovery() -> None:
    text = ROUTE.read_text()
    for hop in ("step failure", "agent report", "detect", "decide", "rejoin", "regroup"):
        assert f"| {hop} |" in text
    for hop in ("repaired", "recorded"):
        assert f"| {hop} |" in text
