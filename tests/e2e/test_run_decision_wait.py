"""``MINDIO_WAIT_MINDX_TIME`` through ``unbroken run``: how long a rank whose step failed waits
for the job manager's decision before it gives up.

2 pods x 2 ranks of examples/train_mlp.py on gloo with ``recover-in-place`` and the variable at
2 s. The control plane is stopped (SIGSTOP) and rank 3 killed behind its back: the healthy ranks'
step fails, they stop at its boundary and wait for a decision that cannot come. After 2 s each
gives up, saying why; once the control plane runs again it finds every rank gone and restarts
them from the checkpoint. The job still ends with the fault-free model, bit for bit."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    STEP_SLEEP,
    Reference,
    digest,
    events,
    of_kind,
    start_job,
    status,
    wait_for,
    write_job,
)
from tests.support.process_helpers import status_rank_pids

pytestmark = pytest.mark.e2e

IN_PLACE = FIXTURES / "process-recover-in-place.yaml"
CONTAINER = "            - name: ascend\n"
WAIT_2_S = (
    CONTAINER + "              env:\n"
    "                - name: MINDIO_WAIT_MINDX_TIME\n"
    '                  value: "2"\n'
)
GAVE_UP = "no decision from the job manager within 2 s (MINDIO_WAIT_MINDX_TIME), giving up"


def test_stopped_ranks_give_up_after_mindio_wait_mindx_time_without_a_decision(
    run_dir: Path, tmp_path: Path, fault_free: Reference
) -> None:
    job = write_job(
        tmp_path / "job.yaml",
        job=IN_PLACE,
        replace={CONTAINER: WAIT_2_S, STEP_SLEEP: "--step-sleep=0.1"},
    )
    running = start_job(run_dir, tmp_path / "logs", job=job)
    stopped = False
    try:

        def trained_a_while() -> bool:
            assert running.proc.poll() is None, "the job ended first: " + str(running.output())
            st = status(run_dir)
            return st is not None and st["step"] >= 12

        wait_for(trained_a_while, "step 12", deadline_s=120.0)
        st = status(run_dir)
        assert st is not None
        victim = status_rank_pids(st)[3]
        os.kill(running.proc.pid, signal.SIGSTOP)
        stopped = True
        os.kill(victim, signal.SIGKILL)
        time.sleep(6.0)  # three times the decision wait, no decision possible meanwhile
        os.kill(running.proc.pid, signal.SIGCONT)
        stopped = False
        done = running.wait()
    finally:
        if stopped:
            os.kill(running.proc.pid, signal.SIGCONT)
        running.stop()
    assert done.rc == 0, done.explain()
    assert "job e2e-inplace: SUCCEEDED" in done.stdout, done.explain()
    assert digest(run_dir) == fault_free.digest, "the recovered model differs from the fault-free"
    logs = "".join(p.read_text(errors="replace") for p in (run_dir / "pods").rglob("*.log"))
    gave_up = {
        int(r) for r in re.findall(rf"RecoveryFailed: rank (\d+): .*; {re.escape(GAVE_UP)}", logs)
    }
    assert gave_up == {0, 1, 2}, logs[-3000:]
    evs = events(run_dir)
    loaded = [e for e in of_kind(evs, "StateLoaded") if e["generation"] > 0]
    assert loaded and loaded[-1]["source"] == "checkpoint", loaded
