"""A training script that exits 0 without ever starting an Unbroken session (it never calls
``unbroken.worker.init``, or returns before it): nothing was trained under supervision, so the
job fails and says which ranks, instead of reporting SUCCEEDED without a word."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.cli_runs import Reference, events, of_kind, run_job, status, write_job

pytestmark = pytest.mark.e2e


def test_script_that_exits_at_once_fails_the_job_naming_the_ranks(
    tmp_path: Path, run_dir: Path
) -> None:
    script = tmp_path / "forgot_init.py"
    script.write_text('print("training would go here")\n')
    job = write_job(tmp_path / "job.yaml", script=script)
    res = run_job(run_dir, job=job, timeout_s=120.0)
    assert res.rc == 1, res.explain()
    reason = (
        "ranks 0, 1, 2, 3 exited 0 without starting an Unbroken session (the training script "
        "never called unbroken.worker.init); nothing was trained"
    )
    assert f"reason: {reason}" in res.stderr.splitlines(), res.explain()
    assert "SUCCEEDED" not in res.stdout
    (failed,) = of_kind(events(run_dir), "JobFailed")
    assert failed["reason"] == reason
    st = status(run_dir)
    assert st is not None and st["phase"] == "Failed", st


def test_a_script_with_a_session_still_succeeds(fault_free: Reference) -> None:
    (done,) = of_kind(events(fault_free.run_dir), "JobSucceeded")
    assert done["step"] == 60
