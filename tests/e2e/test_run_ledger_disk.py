"""The disk of the run's ledger fills up while the job trains: ``unbroken run`` stops every
process and says so in one line (exit 1), instead of dying with a traceback and leaving its
agents and ranks training unrecorded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.cli_runs import assert_no_processes_left, start_job, wait_for, write_job
from tests.support.disks import tmpfs

pytestmark = pytest.mark.e2e


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, mounted for the test and removed after it."""
    with tmpfs(tmp_path / "disk", "size=4m") as mount:
        yield mount


def _fill(disk: Path) -> None:
    with (disk / "filler").open("wb") as f:
        block = b"\0" * 65536
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass


def test_full_ledger_disk_stops_the_run_with_one_line(tmp_path: Path, small_disk: Path) -> None:
    job = write_job(
        tmp_path / "job.yaml",
        replace={"--steps=60": "--steps=2000", "--ckpt-dir=checkpoints": f"--ckpt-dir={tmp_path}"},
    )
    run_dir = small_disk / "run"
    bg = start_job(run_dir, tmp_path / "logs", job=job)
    try:
        wait_for(lambda: "/2000 (generation 0" in bg.output()[0], "training under way", 120.0)
        _fill(small_disk)
        res = bg.wait(60.0)
    finally:
        bg.stop()
    assert res.rc == 1, res.explain()
    (line,) = res.stderr.splitlines()
    assert line == (
        "unbroken run: cannot write the run's ledger, so the run was stopped: ledger "
        f"{run_dir / 'ledger.db'}: database or disk is full"
    ), res.explain()
    assert_no_processes_left(run_dir)
