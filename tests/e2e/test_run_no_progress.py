"""Faults that recur at the same place with no step committed in between: the job backs off
and ends with the reason after ``no-progress-restarts`` of them, instead of restarting its
ranks several times a second for ``max_restarts`` rounds while the ledger grows."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import events, of_kind, run_job, write_job

pytestmark = pytest.mark.e2e

#: The annotation that bounds the faults in a row without progress (default 8).
NO_PROGRESS_3 = {
    'pod-rescheduling: "on"\n': 'pod-rescheduling: "on"\n'
    "  annotations:\n"
    '    no-progress-restarts: "3"\n'
}


def test_script_that_raises_at_import_fails_the_job_with_the_reason(
    tmp_path: Path, run_dir: Path
) -> None:
    script = tmp_path / "broken_train.py"
    script.write_text('raise RuntimeError("the dataset is missing")\n')
    job = write_job(tmp_path / "job.yaml", replace=NO_PROGRESS_3, script=script)
    res = run_job(run_dir, job=job, timeout_s=120.0)
    assert res.rc == 1, res.explain()
    assert "Traceback" not in res.stderr, res.explain()
    reason = (
        "no progress: 4 faults in a row with no step committed at all (no-progress-restarts 3)"
    )
    assert reason in res.stdout + res.stderr, res.explain()
    evs = events(run_dir)
    (failed,) = of_kind(evs, "JobFailed")
    assert reason in failed["reason"]
    assert "RuntimeError" in failed["reason"]
    # Bounded: a few rounds (each rank of a round may report its fault), backed off, and a
    # ledger of kilobytes, not the megabytes of 32767 rounds.
    assert len(of_kind(evs, "FaultDetected")) <= 16, res.explain()
    assert any("backing off" in e.get("reason", "") for e in of_kind(evs, "DecisionMade"))
    assert (run_dir / "ledger.db").stat().st_size < 256 * 1024
