"""A training script that exits 0 without ever starting an Unbroken session (it never calls
``unbroken.worker.init``): a plain torchrun script, which succeeds as under torchrun. Unbroken
sees none of its steps, so the run says once which rungs the job did not have, and its summary
says that no step was seen: for a script that did nothing at all, that is the warning.
(Ranks without a session beside ranks with one still fail the job:
tests/component/manager/test_sessionless_component.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.cli_runs import Reference, events, of_kind, run_job, status, write_job

pytestmark = pytest.mark.e2e


def test_script_that_exits_at_once_succeeds_saying_no_step_was_seen(
    tmp_path: Path, run_dir: Path
) -> None:
    script = tmp_path / "forgot_init.py"
    script.write_text('print("training would go here")\n')
    job = write_job(tmp_path / "job.yaml", script=script)
    res = run_job(run_dir, job=job, timeout_s=120.0)
    assert res.rc == 0, res.explain()
    assert "job e2e-mlp: SUCCEEDED" in res.stdout, res.explain()
    assert "steps not seen (no Unbroken session)" in res.stdout, res.explain()
    evs = events(run_dir)
    (said,) = of_kind(evs, "RungsUnavailable")
    assert said["ranks"] == [0, 1, 2, 3] and said["rungs"] == [], said
    assert said["reason"].startswith(
        "ranks 0, 1, 2, 3 run without an Unbroken session (the script does not call "
        "unbroken.worker.init)"
    ), said
    assert not of_kind(evs, "JobFailed")
    st = status(run_dir)
    assert st is not None and st["phase"] == "Succeeded", st
    assert st["message"] == "all 4 ranks exited 0", st


def test_a_script_with_a_session_still_succeeds(fault_free: Reference) -> None:
    (done,) = of_kind(events(fault_free.run_dir), "JobSucceeded")
    assert done["step"] == 60
