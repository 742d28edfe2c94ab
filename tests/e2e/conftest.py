"""Fixtures of the e2e tests: a run directory per test (checked for leftover processes after
the test) and the fault-free run every faulted run's final model is compared with."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support import cli_runs
from tests.support.cli_runs import Reference, assert_no_processes_left, digest, run_job


@pytest.fixture(scope="session", autouse=True)
def shared_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One node image for every run of the session (``UNBROKEN_SHARED_IMAGE``); ended, by the
    pid it wrote, when the session ends."""
    directory = tmp_path_factory.mktemp("images")
    directory.chmod(0o700)
    cli_runs.SHARED_IMAGE = directory
    yield directory
    cli_runs.SHARED_IMAGE = None
    for pidfile in directory.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and _running(pid):
                time.sleep(0.05)
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs; an exited child of this process (a subreaper, which the
    orphaned image may have come to) is reaped."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture(scope="session")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The e2e job run once without faults: its final model digest is the one every faulted
    run must end with, bit for bit. Run once for the whole session: pytest-xdist workers
    share it (the first to take the lock runs it; the others read its digest); tests only
    read its run directory."""
    base = tmp_path_factory.getbasetemp()
    if base.name.startswith("popen-gw"):
        base = base.parent  # the directory every worker's own lies in
    shared = base / "fault-free-shared"
    shared.mkdir(exist_ok=True)
    with (shared / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run_dir, done = shared / "run", shared / "digest"
        if done.exists():
            return Reference(run_dir, done.read_text())
        res = run_job(run_dir)
        assert_no_processes_left(run_dir)
        assert res.rc == 0, res.explain()
        assert "job e2e-mlp: SUCCEEDED" in res.stdout, res.explain()
        assert "0 fault(s), 0 recovery(ies)" in res.stdout, res.explain()
        ref = Reference(run_dir, digest(run_dir))
        done.write_text(ref.digest)
        return ref


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    """Where the test's run lives; after the test, no process of it may be left."""
    path = tmp_path / "run"
    yield path
    assert_no_processes_left(path)
