"""Anyone on the host can open connections to a run's control plane and dashboard (both on
127.0.0.1): hundreds of idle ones, opened again as soon as they close, while a rank is killed
and recovered. The run's descriptors are few (its soft ``RLIMIT_NOFILE`` lowered to 256), yet
the connections never take those the recovery needs: the rank is recovered and the job
succeeds. Its log, at the most verbose (``-vv``), never holds the run's secret."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.cli_runs import (
    Background,
    cli_env,
    events,
    of_kind,
    wait_for,
    write_job,
)
from tests.support.flood import IdleConnections

pytestmark = pytest.mark.e2e

#: The run's descriptors: fewer than the connections held open to it.
NOFILE = 256
#: Idle connections held to the control plane and to the dashboard.
TO_CONTROL = 400
TO_DASHBOARD = 150


def _start(run_dir: Path, logs: Path, *argv: str | Path) -> Background:
    logs.mkdir(parents=True, exist_ok=True)
    args = tuple(str(a) for a in ("-vv", "run", *argv, "--run-dir", run_dir))
    with (logs / "stdout").open("w") as out, (logs / "stderr").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "unbroken", *args],
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            text=True,
        )
    # the run's own limit (its processes inherit it), set before it opens its endpoints
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (NOFILE, hard))
    return Background(args, proc, logs)


def _descriptors(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def test_a_fault_is_recovered_while_idle_connections_flood_both_ports(
    run_dir: Path, tmp_path: Path
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = TO_CONTROL + TO_DASHBOARD + 512  # the flood's sockets and this process's own
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"this process may open {hard} descriptors; the flood needs {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    try:
        _flood_a_recovering_run(run_dir, tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _flood_a_recovering_run(run_dir: Path, tmp_path: Path) -> None:
    job_yaml = write_job(tmp_path / "job.yaml", replace={"--steps=60": "--steps=300"})
    chaos = tmp_path / "kill-late.yaml"
    chaos.write_text("faults:\n  - {kind: kill, rank: 3, at_step: 150}\n")
    job = _start(run_dir, tmp_path / "logs", job_yaml, "--chaos", chaos)
    most = 0
    try:
        control: dict[str, Any] = {}

        def training() -> bool:
            assert job.proc.poll() is None, "the job ended early: " + str(job.output())
            if not control and (run_dir / "control.json").exists():
                control.update(json.loads((run_dir / "control.json").read_text()))
            return bool(control) and re.search(r"\] step \d+/", job.output()[0]) is not None

        wait_for(training, "the job training", deadline_s=120.0)
        flood_at = time.time()
        with (
            IdleConnections([str(control["address"])], TO_CONTROL) as to_control,
            IdleConnections([str(control["metrics"])], TO_DASHBOARD) as to_dashboard,
        ):
            deadline = time.monotonic() + 180.0
            while job.proc.poll() is None and time.monotonic() < deadline:
                most = max(most, _descriptors(job.proc.pid))
                time.sleep(0.25)
            refused = (to_control.closed_by_server, to_dashboard.closed_by_server)
        res = job.wait(timeout_s=30.0)
    finally:
        job.stop()
    assert res.rc == 0, res.explain()
    assert "job e2e-mlp: SUCCEEDED" in res.stdout, res.explain()
    assert most < NOFILE, f"the run used {most} of its {NOFILE} descriptors"
    assert all(n > 0 for n in refused), refused  # both servers shed connections past their bound
    evs = events(run_dir)
    (fault,) = of_kind(evs, "FaultDetected")
    assert fault["at"] > flood_at, "the fault came before the flood"
    assert len(of_kind(evs, "RecoveryCompleted", fault_id=fault["fault_id"])) == 1
    secret = str(control["secret"])
    assert secret not in res.stdout and secret not in res.stderr
