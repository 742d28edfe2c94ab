"""``unbroken inject`` from another process, against a job that ``unbroken run`` is running."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    STEP_SLEEP,
    Reference,
    Result,
    assert_no_processes_left,
    events,
    of_kind,
    processes_of,
    start_job,
    unbroken,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Injected:
    run_dir: Path
    run: Result
    inject: Result


@pytest.fixture(scope="module")
def injected(tmp_path_factory: pytest.TempPathFactory) -> Injected:
    """The e2e job started in the background; once its console says it trained 20 steps,
    ``unbroken inject kill --rank 1`` from this process; then the job runs to its end."""
    base = tmp_path_factory.mktemp("inject")
    run_dir = base / "run"
    # Slow steps: the 40 steps left after step 20 outlast a command from another process on a
    # loaded machine.
    slow = write_job(base / "job.yaml", replace={STEP_SLEEP: "--step-sleep=0.1"})
    job = start_job(run_dir, base / "logs", job=slow)
    try:

        def trained_20_steps() -> bool:
            assert job.proc.poll() is None, "the job ended before the fault: " + str(job.output())
            return "] step 20/60 (generation 0, " in job.output()[0]

        wait_for(trained_20_steps, "the job's console at step 20", deadline_s=180.0)
        # What the leftover check looks for is there while the job runs: the control plane,
        # an agent per pod and the four ranks (warm standbys may come on top).
        running = processes_of(run_dir)
        assert len(running) >= 7, running
        inject = unbroken("inject", "kill", "--rank", "1", "--run", run_dir)
        done = job.wait()
    finally:
        job.stop()
        assert_no_processes_left(run_dir)
    return Injected(run_dir, done, inject)


def test_inject_kill_into_a_running_job(injected: Injected, fault_free: Reference) -> None:
    res = injected.inject
    assert res.rc == 0, res.explain()
    assert re.fullmatch(r"kill: sent SIGKILL to rank 1 \(pid \d+\)\n", res.stdout), res.explain()
    done = injected.run
    assert done.rc == 0, done.explain()
    assert "job e2e-mlp: SUCCEEDED" in done.stdout, done.explain()
    assert "1 fault(s), 1 recovery(ies)" in done.stdout, done.explain()
    result = injected.run_dir / "result.json"
    assert fault_free.digest in result.read_text(), "the recovered model differs"

    evs = events(injected.run_dir)
    faults = of_kind(evs, "FaultDetected")
    assert len(faults) == 1, faults
    fault = faults[0]
    assert fault["ranks"] == [1] and fault["code"] == "signal:SIGKILL", fault
    assert fault["pods"] == ["e2e-mlp-master-0"], fault
    pid = re.search(r"pid (\d+)", res.stdout)
    assert pid is not None and f"rank 1 (pid {pid[1]}) killed by SIGKILL" in fault["detail"]
    assert of_kind(evs, "RecoveryCompleted", fault_id=fault["fault_id"]), evs
    text = unbroken("events", injected.run_dir, "--kind", "FaultInjected")
    assert text.rc == 0, text.explain()
    line = r"FaultInjected +fault=kill detail=" + re.escape(res.stdout.strip())
    assert re.search(line, text.stdout), text.explain()

    # The run is over: its control plane is gone, and inject says so.
    late = unbroken("inject", "kill", "--rank", "1", "--run", injected.run_dir)
    assert late.rc == 1 and late.stdout == "", late.explain()
    assert late.stderr == (
        f"unbroken inject: run {injected.run_dir} is not running (no control.json)\n"
    )


def test_events_json_keeps_the_kind_of_an_injected_fault(injected: Injected) -> None:
    evs = events(injected.run_dir)
    assert [e["detail"] for e in of_kind(evs, "FaultInjected")] == [
        injected.inject.stdout.strip()
    ], evs
