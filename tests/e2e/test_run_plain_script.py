"""A plain torchrun DDP script (``examples/train_torchrun.py``: no Unbroken import, its own
``torch.save`` checkpoint every 10 steps and its own resume) run through ``unbroken run``. Its
job configures the process-level ladder, which such a script cannot have: the run says so once,
trains, and succeeds; a rank killed mid-run is recovered by pod-level rescheduling, which
restarts the processes from the script's checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    events,
    of_kind,
    run_job,
    start_job,
    status,
    unbroken,
    wait_for,
)

pytestmark = pytest.mark.e2e

JOB = FIXTURES / "plain.yaml"
STEPS = 200
START_S = 150.0  # from `unbroken run` to the script's first checkpoint, on two shared cores


def said_once(run_dir: Path) -> dict[str, object]:
    """The run's one record of the rungs the job did not have."""
    (said,) = of_kind(events(run_dir), "RungsUnavailable")
    assert said["ranks"] == [0, 1, 2, 3], said
    assert said["rungs"] == ["retry", "recover-in-place", "recover"], said
    return said


def test_a_plain_torchrun_script_trains_to_its_end_and_succeeds(run_dir: Path) -> None:
    res = run_job(run_dir, job=JOB)
    assert res.rc == 0, res.explain()
    assert "job e2e-plain: SUCCEEDED" in res.stdout, res.explain()
    assert "steps not seen (no Unbroken session); 0 fault(s)" in res.stdout, res.explain()
    said = said_once(run_dir)
    assert "without an Unbroken session" in str(said["reason"])
    result = json.loads((run_dir / "result.json").read_text())
    assert result == {"steps": STEPS, "started_at": 0, "world_size": 4}
    assert len(of_kind(events(run_dir), "JobSucceeded")) == 1
    st = status(run_dir)
    assert st is not None and st["phase"] == "Succeeded", st
    assert st["message"] == "all 4 ranks exited 0", st


def test_a_killed_rank_of_a_plain_script_is_recovered_by_pod_rescheduling(
    tmp_path: Path, run_dir: Path
) -> None:
    """A script without a session shows no step, so a fault keyed by step cannot fire in it,
    and one keyed by seconds would race the start on a loaded machine: the test waits for the
    script's first checkpoint, then injects the chaos kill from outside (``unbroken inject
    kill``)."""
    bg = start_job(run_dir, tmp_path / "logs", "--quiet", job=JOB)
    try:

        def checkpointed() -> bool:
            assert bg.proc.poll() is None, "the job ended before the fault: " + str(bg.output())
            return (run_dir / "checkpoints" / "latest.pt").exists()

        wait_for(checkpointed, "the script's first checkpoint", START_S)
        inject = unbroken("inject", "kill", "--rank", "3", "--run", run_dir)
        assert inject.rc == 0, inject.explain()
        res = bg.wait()
    finally:
        bg.stop()
    assert res.rc == 0, res.explain()
    assert "job e2e-plain: SUCCEEDED" in res.stdout, res.explain()
    assert "1 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    evs = events(run_dir)
    said_once(run_dir)
    (fault,) = of_kind(evs, "FaultDetected")
    assert fault["ranks"] == [3] and fault["code"] == "signal:SIGKILL", fault
    (decision,) = of_kind(evs, "DecisionMade")
    assert decision["strategy"] == "pod-rescheduling", decision
    assert (
        "process-level rungs off: rank(s) 0, 1, 2, 3 have no Unbroken session"
        in (decision["reason"])
    )
    # Said before the decision, at the first moment the run knew.
    kinds = [e["kind"] for e in evs]
    assert kinds.index("RungsUnavailable") < kinds.index("DecisionMade")
    (recovered,) = of_kind(evs, "RecoveryCompleted")
    assert (recovered["strategy"], recovered["generation"]) == ("pod-rescheduling", 1)
    # process-recover-enable paused for the rescheduling, on again once it succeeded (ranks
    # without a session commit no first step the manager sees).
    assert kinds.index("ProcessRecoverPaused") < kinds.index("ProcessRecoverResumed"), kinds
    restarted = of_kind(evs, "ProcessesStarted", generation=1)
    assert sorted(r for e in restarted for r in e["ranks"]) == [0, 1, 2, 3], restarted
    # Every rank restarted and resumed from the script's own checkpoint, to the last step.
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == STEPS and 0 < result["started_at"] < STEPS, result
    assert result["started_at"] % 10 == 0, result
    assert of_kind(evs, "JobSucceeded")
