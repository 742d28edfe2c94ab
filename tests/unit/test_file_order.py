"""The order test files run in on xdist workers: by the recorded seconds, longest first."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.support.file_order import DURATIONS, Recorder, longest_first, recorded

pytestmark = pytest.mark.unit


def test_files_run_longest_first_each_keeping_its_tests_order() -> None:
    ids = ["a.py::t1", "a.py::t2", "b.py::t1", "c.py::t1", "c.py::t2", "d.py::t1"]
    seconds = {"a.py": 1.0, "b.py": 30.0, "c.py": 5.0}
    order = [ids[i] for i in longest_first(ids, seconds)]
    assert order == ["b.py::t1", "c.py::t1", "c.py::t2", "a.py::t1", "a.py::t2", "d.py::t1"]


def test_without_a_record_the_collection_order_stays() -> None:
    ids = ["b.py::t", "a.py::t1", "a.py::t2"]
    assert longest_first(ids, {}) == [0, 1, 2]


def test_a_recorded_run_is_read_back_and_a_bad_file_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    rec = Recorder(path)
    for nodeid, s in [("x.py::t1", 1.25), ("x.py::t1", 0.5), ("y.py::t", 3.0)]:
        rec.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=s))
    rec.pytest_sessionfinish()
    assert recorded(path) == {"x.py": 1.8, "y.py": 3.0}
    path.write_text("[1, 2]")
    assert recorded(path) == {}
    assert recorded(tmp_path / "none.json") == {}


def test_the_repository_record_names_test_files_that_exist() -> None:
    seconds = json.loads(DURATIONS.read_text())
    root = DURATIONS.parent.parent
    assert seconds and all((root / name).is_file() for name in seconds)
