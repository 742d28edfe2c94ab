"""Python source read with ``ast`` (nothing is imported): the names a document gives still name
code under ``src/`` (the docs' tests), and the tiers a test module declares (its ``pytestmark``)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def module_file(parts: list[str]) -> Path | None:
    """The file of module ``a.b.c`` (given as its parts) under ``src/``, if there is one."""
    base = SRC.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defined(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a module or class body defines at its top level."""
    out: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ImportFrom | ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.split(".")[0]] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def resolve(dotted: str) -> str | None:
    """Why ``dotted`` (a module, or a name defined in one, a class's attribute) does not name
    code under ``src/`` (None: it does); a name a module imports is followed to its source."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(parts[:cut])
        if path is None:
            continue
        body: list[ast.stmt] = tree(path).body
        rest = parts[cut:]
        for i, name in enumerate(rest):
            found = defined(body).get(name)
            if found is None:
                return f"{'.'.join(parts[: cut + i])} defines no {name!r}"
            if isinstance(found, ast.ImportFrom) and found.module and found.level == 0:
                return resolve(".".join([found.module, name, *rest[i + 1 :]]))
            if isinstance(found, ast.ClassDef):
                body = found.body
            elif i < len(rest) - 1:
                return f"{name} is not a class: {'.'.join(rest[i + 1 :])} cannot be in it"
        return None
    return f"no module under src/ for {dotted}"


def _mark_name(node: ast.expr) -> str | None:
    """``X`` for ``pytest.mark.X`` or ``pytest.mark.X(...)``; None for anything else."""
    if isinstance(node, ast.Call):
        node = node.func
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
    ):
        return node.attr
    return None


def declared_marks(tree: ast.Module) -> set[str]:
    """The marker names a module's top-level ``pytestmark`` assignments name."""
    marks: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign | ast.AugAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            continue
        elements = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
        marks.update(name for e in elements if (name := _mark_name(e)) is not None)
    return marks
