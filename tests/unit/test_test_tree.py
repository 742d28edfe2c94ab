"""The test tree's own rules, read from its files (never imported):

- every test module (``tests/**/test_*.py``) declares its tier in a module-level
  ``pytestmark``: one of the markers below (a conftest applying one does not count);
- no module under ``tests/`` imports a test module (``test_*``), a ``conftest``, or a helper of
  another folder of the tree: what test modules share lives in ``tests/support`` and is
  imported as ``tests.support.<module>``; a folder's fixtures come from its conftest by name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.pysource import declared_marks

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
TIERS = frozenset({"unit", "component", "multiproc", "e2e", "kind"})
SUPPORT = "support"


def _modules(root: Path) -> Iterator[Path]:
    """Every Python module under ``root``, in a stable order."""
    yield from sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _test_modules(root: Path) -> list[Path]:
    """The test modules under ``root`` (what pytest collects: ``test_*.py``)."""
    return [p for p in _modules(root) if p.name.startswith("test_")]


def untiered(root: Path) -> list[str]:
    """The test modules under ``root`` without a tier marker in ``pytestmark``."""
    return [
        p.relative_to(root).as_posix()
        for p in _test_modules(root)
        if not declared_marks(ast.parse(p.read_text(), filename=str(p))) & TIERS
    ]


def _imported(node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The absolute module names an import statement names (``from m import a``: ``m``,
    and ``m.a`` for ``from tests import a``, which may be a module)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif node.module == "tests":
        yield from (f"tests.{alias.name}" for alias in node.names)
    elif node.module is not None:
        yield node.module


def _forbidden(module: Path, name: str, root: Path, helpers: dict[str, set[Path]]) -> str | None:
    """Why ``module`` may not import ``name``; None where it may."""
    top = name.split(".")[0]
    in_support = module.parent == root / SUPPORT
    if top == "tests":
        if name == f"tests.{SUPPORT}" or name.startswith(f"tests.{SUPPORT}."):
            return None
        return f"{name}: only tests.{SUPPORT} is imported from the test tree"
    if top == "conftest":
        return "conftest: fixtures are used by name, a conftest is never imported"
    if top.startswith("test_") and top in helpers:
        return f"{top}: a test module imports no other test module"
    if (root / top).is_dir() or (root / SUPPORT / f"{top}.py").is_file():
        return f"{name}: the test tree is imported as tests.{SUPPORT}.<module>"
    if top in helpers and (in_support or module.parent not in helpers[top]):
        return f"{top}: a helper of another folder; shared helpers live in tests/{SUPPORT}"
    return None


def import_violations(root: Path) -> list[str]:
    """``module: why`` for every import under ``root`` that breaks the import rule."""
    helpers: dict[str, set[Path]] = {}
    for p in _modules(root):
        if p.parent != root / SUPPORT and p.name != "__init__.py":
            helpers.setdefault(p.stem, set()).add(p.parent)
    found = []
    for module in _modules(root):
        where = module.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(module.read_text(), filename=str(module))):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                if module.parent != root / SUPPORT:
                    found.append(f"{where}:{node.lineno}: a relative import")
                continue
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported(node):
                why = _forbidden(module, name, root, helpers)
                if why is not None:
                    found.append(f"{where}:{node.lineno}: {why}")
    return found


def test_every_test_module_declares_its_tier() -> None:
    missing = untiered(TESTS)
    assert not missing, (
        f"no tier marker ({', '.join(sorted(TIERS))}) in the module-level pytestmark of:\n"
        + "\n".join(missing)
    )


def test_test_modules_share_code_only_through_the_support_package() -> None:
    found = import_violations(TESTS)
    assert not found, "\n".join(found)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


MARKED = "import pytest\n\npytestmark = pytest.mark.{}\n"


def test_the_tier_rule_reads_pytestmark_only(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "unit/test_plain.py": MARKED.format("unit"),
            "unit/test_listed.py": (
                "import pytest\npytestmark = [pytest.mark.e2e, pytest.mark.timeout(9)]\n"
            ),
            "unit/test_annotated.py": "import pytest\npytestmark: object = pytest.mark.kind\n",
            "unit/test_none.py": "def test_x() -> None:\n    pass\n",
            "unit/test_other.py": "import pytest\npytestmark = pytest.mark.timeout(5)\n",
            "unit/test_on_function.py": "import pytest\n@pytest.mark.unit\ndef test_x(): ...\n",
            "unit/test_nested.py": "def f() -> None:\n    pytestmark = 1\n",
            "unit/helper.py": "",
            "unit/conftest.py": MARKED.format("unit"),
        },
    )
    assert untiered(tmp_path) == [
        "unit/test_nested.py",
        "unit/test_none.py",
        "unit/test_on_function.py",
        "unit/test_other.py",
    ]


def test_the_import_rule_allows_support_and_own_folder_helpers_only(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "support/__init__.py": "",
            "support/shared.py": "from tests.support import other\nfrom . import other\n",
            "support/other.py": "from helper import x\n",
            "e2e/helper.py": "",
            "e2e/conftest.py": "from tests.support.shared import y\n",
            "e2e/test_a.py": "from helper import x\nimport tests.support.shared\n",
            "multiproc/test_b.py": (
                "from helper import x\n"
                "from test_a import y\n"
                "import conftest\n"
                "from tests.e2e.helper import x\n"
                "from tests import e2e, support\n"
                "from e2e import helper\n"
                "from . import z\n"
                "from shared import y\n"
                "def f() -> None:\n"
                "    import test_a\n"
            ),
            "component/manager/test_c.py": "from test_d import y\n",
            "component/manager/test_d.py": "",
        },
    )
    found = import_violations(tmp_path)
    assert [line.split(": ")[0] for line in found] == [
        "component/manager/test_c.py:1",
        "multiproc/test_b.py:1",
        "multiproc/test_b.py:2",
        "multiproc/test_b.py:3",
        "multiproc/test_b.py:4",
        "multiproc/test_b.py:5",
        "multiproc/test_b.py:6",
        "multiproc/test_b.py:7",
        "multiproc/test_b.py:8",
        "multiproc/test_b.py:10",
        "support/other.py:1",
    ]
