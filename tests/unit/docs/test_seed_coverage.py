"""The seed coverage table (docs/seed-coverage.md) names real code and real tests.

Read from the files (markdown and ``ast``), never imported, so neither torch nor a test module
is loaded:

- every ``tests/...py::name`` (or ``::Class::name``) in the "proven by" column is a test
  function (or method) defined in that file;
- every dotted name in the "where" column resolves to a module under ``src/`` (a ``.py`` file
  or a package's ``__init__.py``), and a ``module.name`` form to something defined in it;
- a row's status is the highest tier of the tests it names (from each file's ``pytestmark``),
  an ``end-to-end`` row names a test under ``tests/e2e/``, and a ``not here`` row gives its
  reason;
- the count line at the end matches the rows.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from tests.support import pysource

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "seed-coverage.md"

HEADER = ("seed item", "status", "where it is implemented", "proven by")
#: The statuses, and the test tier each one stands for (None: no tier is required).
STATUSES: dict[str, str | None] = {
    "end-to-end": "e2e",
    "multiproc": "multiproc",
    "component": "component",
    "unit": "unit",
    "not here": None,
}
#: Test tiers from the lowest to the highest.
TIERS = ("unit", "component", "multiproc", "e2e")
SPAN = re.compile(r"`([^`]+)`")
CELL_SPLIT = re.compile(r"(?<!\\)\|")
#: The installed packages under src/: Unbroken and the seed's ``taskd`` import paths beside it.
DOTTED = re.compile(r"(unbroken|taskd)(\.[A-Za-z_]\w*)*")
TEST_ID = re.compile(r"(tests/[\w/]+\.py)((?:::\w+){1,2})")
COUNT_LINE = re.compile(r"^\*\*Count:\*\* (\d+) rows: (.+)\.$")
COUNT_ITEM = re.compile(r"(\d+) `([a-z -]+)`")
MIN_REASON = 10  # characters: "Ascend" alone is not a reason


@dataclass(frozen=True)
class Row:
    section: str
    line: int
    item: str
    status_cell: str
    where_cell: str
    proven_cell: str

    @property
    def name(self) -> str:
        """How a failure message names the row."""
        return f"docs/seed-coverage.md:{self.line} [{self.section}] {self.item}"

    @property
    def status(self) -> str:
        spans = SPAN.findall(self.status_cell)
        return spans[0] if spans else ""

    @property
    def reason(self) -> str:
        """What follows the status word, without the separating punctuation."""
        _, _, rest = self.status_cell.partition(f"`{self.status}`")
        return rest.strip(" :;,.-")

    @property
    def where(self) -> list[str]:
        return SPAN.findall(self.where_cell)

    @property
    def tests(self) -> list[str]:
        return SPAN.findall(self.proven_cell)


def cells(line: str) -> list[str]:
    """The cells of a markdown table line (``\\|`` is a pipe inside a cell)."""
    parts = CELL_SPLIT.split(line.strip())
    return [p.strip() for p in parts[1:-1]]


def parse(text: str) -> tuple[list[Row], list[str], list[str]]:
    """The rows of every table, the count lines, and the problems of the tables' shape."""
    rows: list[Row] = []
    counts: list[str] = []
    problems: list[str] = []
    section = ""
    in_table = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        if COUNT_LINE.match(line):
            counts.append(line)
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        row = cells(line)
        if not in_table:
            in_table = True
            if tuple(row) != HEADER:
                problems.append(f"docs/seed-coverage.md:{number}: table header {row}, not {HEADER}")
            continue
        if all(set(cell) <= set("-: ") for cell in row):
            continue  # the separator line
        if len(row) != len(HEADER):
            problems.append(
                f"docs/seed-coverage.md:{number} [{section}]: {len(row)} cells, not {len(HEADER)}"
            )
            continue
        rows.append(Row(section, number, *row))
    return rows, counts, problems


@cache
def _document() -> tuple[list[Row], list[str], list[str]]:
    return parse(DOC.read_text())


def rows() -> list[Row]:
    return _document()[0]


# ---- the "where" column -------------------------------------------------------------------------


def resolve(dotted: str) -> str | None:
    """Why ``dotted`` does not name code under src/ (None: it does)."""
    if not DOTTED.fullmatch(dotted):
        return f"{dotted!r} is not a dotted name of the unbroken package (or taskd)"
    return pysource.resolve(dotted)


# ---- the "proven by" column ---------------------------------------------------------------------


def find_test(test_id: str) -> str | None:
    """Why ``test_id`` does not name a test function (None: it does)."""
    match = TEST_ID.fullmatch(test_id)
    if match is None:
        return f"{test_id!r} is not tests/...py::name or tests/...py::Class::name"
    path = ROOT / match.group(1)
    if not path.is_file():
        return f"{match.group(1)} does not exist"
    *owners, name = match.group(2).split("::")[1:]
    body: list[ast.stmt] = pysource.tree(path).body
    for owner in owners:
        found = pysource.defined(body).get(owner)
        if not isinstance(found, ast.ClassDef):
            return f"{match.group(1)} defines no class {owner!r}"
        body = found.body
    found = pysource.defined(body).get(name)
    if not isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef):
        where = "::".join([match.group(1), *owners])
        return f"{where} defines no function {name!r}"
    if not name.startswith("test"):
        return f"{test_id}: {name!r} is not a test (pytest collects test* only)"
    return None


@cache
def tier_of(path: str) -> str | None:
    """The highest tier a test module's ``pytestmark`` declares (None: none)."""
    marks = pysource.declared_marks(pysource.tree(ROOT / path))
    found = [t for t in TIERS if t in marks]
    return found[-1] if found else None


# ---- the checks, each failure naming its row ----------------------------------------------------


def proven_by_problems(row: Row) -> list[str]:
    return [
        f"{row.name}: {why}" for test_id in row.tests if (why := find_test(test_id)) is not None
    ]


def where_problems(row: Row) -> list[str]:
    found = [f"{row.name}: {why}" for name in row.where if (why := resolve(name)) is not None]
    if not row.where and row.status != "not here":
        found.append(f"{row.name}: {row.status} but no code named in the where column")
    return found


def status_problems(row: Row) -> list[str]:
    if row.status not in STATUSES:
        return [f"{row.name}: status {row.status!r}, not one of {', '.join(STATUSES)}"]
    if row.status == "not here":
        if len(row.reason) < MIN_REASON:
            return [f"{row.name}: not here, but no reason given ({row.status_cell!r})"]
        return []
    found = []
    paths = [t.split("::", 1)[0] for t in row.tests if find_test(t) is None]
    if not paths:
        return [f"{row.name}: {row.status}, but it names no test that proves it"]
    tiers = {path: tier_of(path) for path in paths}
    for path, tier in sorted(tiers.items()):
        if tier is None:
            found.append(f"{row.name}: {path} declares no tier in its pytestmark")
    known = [t for t in tiers.values() if t is not None]
    highest = max(known, key=TIERS.index) if known else None
    if highest != STATUSES[row.status]:
        found.append(
            f"{row.name}: status {row.status}, but the highest tier of its tests is {highest}"
        )
    if row.status == "end-to-end" and not any(p.startswith("tests/e2e/") for p in tiers):
        found.append(f"{row.name}: end-to-end, but it names no test under tests/e2e/")
    return found


def count_problems(all_rows: list[Row], count_lines: list[str]) -> list[str]:
    if len(count_lines) != 1:
        return [f"{len(count_lines)} count lines ('**Count:** N rows: ...'), not 1"]
    match = COUNT_LINE.match(count_lines[0])
    assert match is not None
    found = []
    if int(match.group(1)) != len(all_rows):
        found.append(f"the count line says {match.group(1)} rows; the tables have {len(all_rows)}")
    said = {status: int(n) for n, status in COUNT_ITEM.findall(match.group(2))}
    actual: dict[str, int] = {}
    for row in all_rows:
        actual[row.status] = actual.get(row.status, 0) + 1
    for status in sorted(set(said) | set(actual)):
        if said.get(status, 0) != actual.get(status, 0):
            names = [r.item for r in all_rows if r.status == status]
            found.append(
                f"the count line says {said.get(status, 0)} {status}; the tables have "
                f"{actual.get(status, 0)}: {names}"
            )
    return found


def test_the_tables_have_the_four_columns_and_a_row_per_seed_item() -> None:
    all_rows, _, problems = _document()
    assert problems == []
    assert len(all_rows) >= 60, "the table covers too little of the seed"
    seen: dict[str, Row] = {}
    for row in all_rows:
        assert row.item not in seen, f"{row.name}: the same item as line {seen[row.item].line}"
        seen[row.item] = row


def test_every_named_test_exists() -> None:
    found = [p for row in rows() for p in proven_by_problems(row)]
    assert found == [], "\n".join(found)


def test_every_named_module_resolves_under_src() -> None:
    found = [p for row in rows() for p in where_problems(row)]
    assert found == [], "\n".join(found)


def test_every_status_is_what_its_tests_prove() -> None:
    found = [p for row in rows() for p in status_problems(row)]
    assert found == [], "\n".join(found)


def test_the_count_line_matches_the_rows() -> None:
    _, count_lines, _ = _document()
    found = count_problems(rows(), count_lines)
    assert found == [], "\n".join(found)


# ---- the checks find what they are for ----------------------------------------------------------

UNIT_TEST = "tests/unit/spec/test_spec_job.py::test_missing_file"
E2E_TEST = "tests/e2e/test_run_faults.py::test_lost_node_moves_its_pod_to_the_spare_node"
BAD = f"""\
## Broken

| seed item | status | where it is implemented | proven by |
|---|---|---|---|
| `a` | `end-to-end` | `unbroken.spec.knobs.Strategy` | `{UNIT_TEST}` |
| `b` | `unit` | `unbroken.spec.no_such_module` | `tests/unit/spec/test_spec_job.py::test_nope` |
| `c` | `not here` | — | — |
| `d` | `unit` | `unbroken.spec.knobs.Strategy.NO_SUCH` | `{E2E_TEST}` |
| `e` | `perhaps` | `unbroken.spec.knobs` | — |

**Count:** 4 rows: 1 `end-to-end`, 1 `unit`.
"""


def test_a_broken_table_is_found_out_row_by_row() -> None:
    bad_rows, count_lines, problems = parse(BAD)
    assert problems == []
    by_item = {row.item.strip("`"): row for row in bad_rows}
    assert [p.split(": ", 1)[0] for p in status_problems(by_item["a"])] == [
        "docs/seed-coverage.md:5 [Broken] `a`",
        "docs/seed-coverage.md:5 [Broken] `a`",
    ]
    assert "no test under tests/e2e/" in status_problems(by_item["a"])[1]
    assert "defines no function 'test_nope'" in proven_by_problems(by_item["b"])[0]
    assert "unbroken.spec defines no 'no_such_module'" in where_problems(by_item["b"])[0]
    assert "no reason given" in status_problems(by_item["c"])[0]
    assert "defines no 'NO_SUCH'" in where_problems(by_item["d"])[0]
    assert "highest tier of its tests is e2e" in status_problems(by_item["d"])[0]
    assert "not one of" in status_problems(by_item["e"])[0]
    counted = count_problems(bad_rows, count_lines)
    assert "the count line says 4 rows; the tables have 5" in counted
    assert any("says 1 unit; the tables have 2" in p for p in counted), counted


@pytest.mark.parametrize(
    ("dotted", "why"),
    [
        ("unbroken.spec.faulthandling", None),
        ("unbroken.spec", None),
        ("unbroken.spec.knobs.STRATEGY_PRIORITY", None),  # an annotated assignment
        ("unbroken.worker.opretry.OpRetrier.reexecute", None),  # a method
        ("unbroken.spec.faulthandling.FaultHandling", None),  # imported from unbroken.spec.knobs
        ("unbroken.spec.knobs.nothing", "unbroken.spec.knobs defines no 'nothing'"),
        ("unbroken.nowhere.thing", "unbroken defines no 'nowhere'"),
        ("nowhere.thing", "is not a dotted name of the unbroken package (or taskd)"),
        ("torch.nn", "is not a dotted name of the unbroken package (or taskd)"),
    ],
)
def test_resolve(dotted: str, why: str | None) -> None:
    got = resolve(dotted)
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got


@pytest.mark.parametrize(
    ("test_id", "why"),
    [
        ("tests/unit/docs/test_seed_coverage.py::test_resolve", None),
        ("tests/unit/docs/test_seed_coverage.py::Row", "defines no function 'Row'"),
        ("tests/unit/docs/test_seed_coverage.py::Row::name", "is not a test"),
        ("tests/unit/docs/test_seed_coverage.py::Nope::test_x", "defines no class 'Nope'"),
        ("tests/unit/no_such_file.py::test_x", "does not exist"),
        ("tests/unit/docs/test_seed_coverage.py", "is not tests/...py::name"),
    ],
)
def test_find_test(test_id: str, why: str | None) -> None:
    got = find_test(test_id)
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got
