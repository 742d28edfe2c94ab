"""The package's shape: it imports one way (each part of ``src/unbroken`` imports only parts
below it, and no module imports itself back through others, not even through an import inside
a function), and no module grows past :data:`MAX_LINES` (a file that long holds more than one
concept: split it along a seam). The top-level packages installed beside it for the seed's
import paths (:data:`FACADES`) sit above it: they may import it, it never imports them. Read from
the source (ast): nothing is imported."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_LINES = 800
PACKAGE = "unbroken"
#: Top-level packages beside the package, for the seed's import paths (``src/taskd``).
FACADES = ("taskd",)

#: The parts of the package from the bottom up; a part may import its own layer's other parts
#: only where the entry says so (``ALSO``), and any part of a layer below.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"spec"}),
    frozenset({"protocol", "rpc", "ledger", "devices", "checkpoint"}),
    frozenset({"faults", "report", "worker"}),
    frozenset({"policy", "chaos", "mindspore"}),
    frozenset({"scheduler", "agent"}),
    frozenset({"manager", "operator"}),
    frozenset({"cli"}),
    frozenset({"compat", "__main__"}),
)
#: Imports between parts of one layer, each one way.
ALSO = {
    ("faults", "protocol"),
    ("rpc", "protocol"),
    ("report", "ledger"),
    ("worker", "checkpoint"),
    ("worker", "devices"),
    ("chaos", "devices"),
    ("scheduler", "policy"),
}


def modules(*packages: str) -> dict[str, Path]:
    """The modules of the top-level ``packages`` (default: the package itself) by name."""
    out = {}
    for path in (p for package in packages or (PACKAGE,) for p in (SRC / package).rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(path: Path, known: Mapping[str, Path]) -> set[str]:
    """The modules of this package ``path`` imports, at any depth of its code. ``from pkg
    import sub`` of a submodule depends on ``pkg.sub``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names}
            found = subs & set(known)
            out.update(found)
            if len(found) < len(subs):
                out.add(node.module)
    return {m for m in out if m in known}


def part(module: str) -> str:
    names = module.split(".")
    return names[1] if len(names) > 1 else ""


def layer(name: str) -> int:
    return next(i for i, parts in enumerate(LAYERS) if name in parts)


def graph(*packages: str) -> dict[str, set[str]]:
    known = modules(*packages)
    return {m: imports(p, known) - {m} for m, p in known.items()}


def upward(g: Mapping[str, set[str]]) -> set[str]:
    out = set()
    for m, deps in g.items():
        for d in deps:
            a, b = part(m), part(d)
            if not a or not b or a == b:
                continue
            if layer(b) > layer(a) or (layer(b) == layer(a) and (a, b) not in ALSO):
                out.add(f"{m} -> {d}")
    return out


def top(module: str) -> str:
    return module.split(".")[0]


def into_facades(g: Mapping[str, set[str]]) -> set[str]:
    """``m -> d`` for every module ``m`` of the package that imports a facade's module ``d``."""
    return {
        f"{m} -> {d}"
        for m, deps in g.items()
        if top(m) == PACKAGE
        for d in deps
        if top(d) in FACADES
    }


def circles(g: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {part(m) for m in modules()} - {""}
    assert parts == set().union(*LAYERS)


def test_no_part_imports_a_part_above_it() -> None:
    g = graph()
    assert sum(len(d) for d in g.values()) > 500  # the check sees the imports
    assert upward(g) == set()


def test_no_module_imports_itself_back() -> None:
    assert circles(graph()) == []


def test_the_checks_find_what_they_look_for() -> None:
    g = {"unbroken.agent.a": {"unbroken.manager.b"}, "unbroken.manager.b": {"unbroken.agent.a"}}
    assert upward(g) == {"unbroken.agent.a -> unbroken.manager.b"}
    assert circles(g) == [["unbroken.agent.a", "unbroken.manager.b"]]
    g = {"taskd.api": {"unbroken.compat.taskd"}, "unbroken.compat.taskd": {"taskd.api"}}
    assert into_facades(g) == {"unbroken.compat.taskd -> taskd.api"}


def test_the_facades_import_the_package_and_it_never_imports_them() -> None:
    g = graph(PACKAGE, *FACADES)
    for facade in FACADES:
        assert any(top(d) == PACKAGE for m, deps in g.items() if top(m) == facade for d in deps)
    assert into_facades(g) == set()


def test_no_module_is_longer_than_the_limit() -> None:
    lengths = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    assert max(lengths.values()) > MAX_LINES / 2  # the check reads the files
    assert {m: n for m, n in lengths.items() if n > MAX_LINES} == {}
