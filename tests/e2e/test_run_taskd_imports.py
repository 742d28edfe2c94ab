"""A training script with the seed's TaskD worker snippet, its import lines verbatim
(``from taskd.api.taskd_worker_api import ...``), and an Unbroken session
(``tests/fixtures/e2e/train_taskd.py``), run through ``unbroken run``: the imports work unchanged,
``init_taskd_worker`` and ``start_taskd_worker`` return True on every rank (each rank runs under
an Unbroken agent), every rank finds the job's id in ``MINDX_TASK_ID`` as the operator
injects it, the session trains to its end, and the run succeeds with the whole ladder
(it never says that rungs are unavailable: the script has a session)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support.cli_runs import FIXTURES, events, of_kind, run_job, write_job

pytestmark = pytest.mark.e2e

SCRIPT = FIXTURES / "train_taskd.py"
STEPS = 20


def test_a_script_with_the_seeds_taskd_imports_and_a_session_succeeds(
    tmp_path: Path, run_dir: Path
) -> None:
    job = write_job(
        tmp_path / "job.yaml", script=SCRIPT, replace={"--steps=60": f"--steps={STEPS}"}
    )
    res = run_job(run_dir, job=job)
    assert res.rc == 0, res.explain()
    assert "job e2e-mlp: SUCCEEDED" in res.stdout, res.explain()
    assert "0 fault(s), 0 recovery(ies)" in res.stdout, res.explain()
    result = json.loads((run_dir / "result.json").read_text())
    assert result == {
        "steps": STEPS,
        "world_size": 4,
        "start_step": 0,
        "taskd_worker": [[True, True]] * 4,
        "mindx_task_id": ["e2e-mlp"] * 4,
    }, result
    evs = events(run_dir)
    assert of_kind(evs, "RungsUnavailable") == []
    assert len(of_kind(evs, "JobSucceeded")) == 1
