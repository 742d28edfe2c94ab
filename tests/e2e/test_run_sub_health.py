"""``unbroken run`` with each ``subHealthyStrategy`` but ``hotSwitch`` (that one has its own
file): 2 pods x 2 ranks of examples/train_mlp.py on gloo, one spare node. Rank 3's device turns
sub-healthy (80E20207) at step 5:

- ``ignore`` (the default): training goes on untouched; new pods avoid the node;
- ``graceExit``: the healthy ranks save the interrupted step (last words), then the pod moves
  to the spare node and the job resumes from those last words: no step is trained twice;
- ``forceExit``: the pod moves at once, without a grace period or last words, and the job
  resumes from its newest checkpoint.

Each run ends with the fault-free run's model, bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    JOB,
    SLOW_STEP_SLEEP,
    STEP_SLEEP,
    Reference,
    digest,
    events,
    of_kind,
    run_job,
    write_job,
)
from tests.support.process_helpers import recomputed_steps

pytestmark = pytest.mark.e2e

DUMP = FIXTURES / "process-dump.yaml"
RESCHEDULING = 'pod-rescheduling: "on"'


def run_sub_health(
    run_dir: Path, tmp_path: Path, job: Path, strategy: str | None
) -> tuple[str, list[dict[str, Any]]]:
    """The job with ``strategy`` (None: the label left out) and slower steps, its device fault
    seen by the device plugin's next poll (every 3 s) while it still trains."""
    replace = {STEP_SLEEP: SLOW_STEP_SLEEP}
    if strategy is not None:
        replace[RESCHEDULING] = f'{RESCHEDULING}\n    subHealthyStrategy: "{strategy}"'
    res = run_job(
        run_dir,
        "--cluster",
        FIXTURES / "cluster-fast-watch.yaml",
        "--chaos",
        FIXTURES / "device-subhealth.yaml",
        job=write_job(tmp_path / "job.yaml", job=job, replace=replace),
    )
    assert res.rc == 0, res.explain()
    return res.stdout, events(run_dir)


def the_fault(evs: list[dict[str, Any]]) -> dict[str, Any]:
    (fault,) = of_kind(evs, "FaultDetected")
    assert (fault["source"], fault["code"], fault["level"]) == (
        "sub-health",
        "80E20207",
        "SubHealth",
    ), fault
    assert fault["ranks"] == [3] and fault["nodes"] == ["node-1"], fault
    return fault


def test_ignore_keeps_training_and_places_new_pods_elsewhere(
    run_dir: Path, tmp_path: Path, fault_free: Reference
) -> None:
    out, evs = run_sub_health(run_dir, tmp_path, JOB, None)
    assert "step 60/60; 1 fault(s), 0 recovery(ies)" in out, out
    assert digest(run_dir) == fault_free.digest
    fault = the_fault(evs)
    (decided,) = of_kind(evs, "DecisionMade", fault_id=fault["fault_id"])
    assert "subHealthyStrategy ignore: ignored" in decided["reason"], decided
    assert [e["node"] for e in of_kind(evs, "NodeDeprioritised")] == ["node-1"]
    assert not of_kind(evs, "PodsStopped") and not of_kind(evs, "DeviceIsolated")
    assert len(of_kind(evs, "ProcessesStarted")) == 2, "a process restarted"


def test_grace_exit_saves_last_words_then_moves_the_pod(
    run_dir: Path, tmp_path: Path, fault_free: Reference
) -> None:
    out, evs = run_sub_health(run_dir, tmp_path, DUMP, "graceExit")
    assert "step 60/60; 1 fault(s), 1 recovery(ies)" in out, out
    assert digest(run_dir) == fault_free.digest
    fault = the_fault(evs)
    (decided,) = of_kind(evs, "DecisionMade", fault_id=fault["fault_id"])
    assert decided["strategy"] == "pod-rescheduling", decided
    assert "subHealthyStrategy graceExit: last words, then pod-level" in decided["reason"]
    (words,) = of_kind(evs, "CheckpointSaved", last_words=True)
    (stopped,) = of_kind(evs, "PodsStopped")
    assert stopped["pods"] == ["e2e-dump-worker-0"] and stopped["graceful"], stopped
    assert [(e["pod"], e["node"]) for e in of_kind(evs, "PodPlaced", generation=1)] == [
        ("e2e-dump-worker-0", "node-2")
    ]
    (loaded,) = of_kind(evs, "StateLoaded", generation=1)
    assert loaded["step"] == words["step"], (loaded, words)
    assert recomputed_steps(run_dir) == 0


def test_force_exit_moves_the_pod_at_once_from_the_checkpoint(
    run_dir: Path, tmp_path: Path, fault_free: Reference
) -> None:
    out, evs = run_sub_health(run_dir, tmp_path, JOB, "forceExit")
    assert "step 60/60; 1 fault(s), 1 recovery(ies)" in out, out
    assert digest(run_dir) == fault_free.digest
    fault = the_fault(evs)
    (decided,) = of_kind(evs, "DecisionMade", fault_id=fault["fault_id"])
    assert decided["strategy"] == "pod-rescheduling", decided
    assert "subHealthyStrategy forceExit" in decided["reason"], decided
    assert not of_kind(evs, "CheckpointSaved", last_words=True)
    (stopped,) = of_kind(evs, "PodsStopped")
    assert stopped["pods"] == ["e2e-mlp-worker-0"] and not stopped["graceful"], stopped
    assert [(e["pod"], e["node"]) for e in of_kind(evs, "PodPlaced", generation=1)] == [
        ("e2e-mlp-worker-0", "node-2")
    ]
    (loaded,) = of_kind(evs, "StateLoaded", generation=1)
    # From a checkpoint (every 10 steps) of a step before the fault; a poll that saw the fault
    # before the first one was saved moves the pod from the initial state.
    assert loaded["step"] % 10 == 0 and loaded["step"] <= fault["step"], (loaded, fault)
    assert loaded["source"] == ("checkpoint" if loaded["step"] else "initial"), loaded
