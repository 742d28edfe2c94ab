"""Fixtures of the e2e tests: a run directory per test (checked for leftover processes after
the test) and the fault-free run every faulted run's final model is compared with."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runs import Reference, assert_no_processes_left, digest, run_job


@pytest.fixture(scope="session")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The e2e job run once without faults: its final model digest is the one every faulted
    run must end with, bit for bit."""
    run_dir = tmp_path_factory.mktemp("fault-free") / "run"
    res = run_job(run_dir)
    assert_no_processes_left(run_dir)
    assert res.rc == 0, res.explain()
    assert "job e2e-mlp: SUCCEEDED" in res.stdout, res.explain()
    assert "0 fault(s), 0 recovery(ies)" in res.stdout, res.explain()
    return Reference(run_dir, digest(run_dir))


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    """Where the test's run lives; after the test, no process of it may be left."""
    path = tmp_path / "run"
    yield path
    assert_no_processes_left(path)
