"""A training script with the seed's TaskD worker snippet, its import lines verbatim
(``from taskd.api.taskd_worker_api import ...``), and an Unbroken session
(``tests/fixtures/e2e/train_taskd.py``), run through ``unbroken run``: the imports work unchanged,
``init_taskd_worker`` and ``start_taskd_worker`` return True on every rank (each rank runs under
an Unbroken agent), every rank finds the job's id in ``MINDX_TASK_ID`` as the operator
injects it, the session trains to its end, and the run succeeds with the whole ladder
(it never says that rungs are unavailable: the script has a session). The script's process
also imports ``taskd.python.adaptor.patch``, the line the seed's image adds to torch's launcher,
and the seed's ``manager.py`` runs beside the job as rank 0's pod runs it, waiting while the
job lives and ending when it ends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    REPO,
    cli_env,
    events,
    of_kind,
    start_job,
    status,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.e2e

SCRIPT = FIXTURES / "train_taskd.py"
MANAGER_PY = REPO / "examples" / "taskd" / "manager.py"
STEPS = 20


def test_a_script_with_the_seeds_taskd_imports_and_a_session_succeeds(
    tmp_path: Path, run_dir: Path
) -> None:
    job = write_job(
        tmp_path / "job.yaml",
        script=SCRIPT,
        replace={"--steps=60": f"--steps={STEPS}", "--step-sleep=0.02": "--step-sleep=0.1"},
    )
    running = start_job(run_dir, tmp_path / "logs", "--quiet", job=job)
    manager = None
    try:
        wait_for(lambda: (run_dir / "control.json").exists(), "the run's control file", 60.0)
        # The seed's container script, on rank 0's pod: python manager.py 2>> error.log &
        env = {**cli_env(), "MINDX_TASK_ID": "e2e-mlp", "UNBROKEN_RUN_DIR": str(run_dir)}
        manager = subprocess.Popen(
            [sys.executable, str(MANAGER_PY)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

        def training() -> bool:
            now = status(run_dir)
            return manager.poll() is not None or (now is not None and now["step"] >= 3)

        wait_for(training, "step 3", 60.0)
        assert manager.poll() is None, "manager.py ended while the job was training"
        res = running.wait()
        _, manager_errors = manager.communicate(timeout=30)
    finally:
        running.stop()
        if manager is not None and manager.poll() is None:
            manager.kill()
            manager.wait()
    assert res.rc == 0, res.explain()
    assert "job e2e-mlp: SUCCEEDED" in res.stdout, res.explain()
    assert "0 fault(s), 0 recovery(ies)" in res.stdout, res.explain()
    assert manager.returncode == 0 and manager_errors == "", manager_errors
    result = json.loads((run_dir / "result.json").read_text())
    assert result == {
        "steps": STEPS,
        "world_size": 4,
        "start_step": 0,
        "taskd_worker": [[True, True]] * 4,
        "mindx_task_id": ["e2e-mlp"] * 4,
        "taskd_process_enable": ["off"] * 4,  # no process-level rung: the operator's value
    }, result
    evs = events(run_dir)
    assert of_kind(evs, "RungsUnavailable") == []
    assert len(of_kind(evs, "JobSucceeded")) == 1
