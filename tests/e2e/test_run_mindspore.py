"""``unbroken run`` with a MindSpore job: ``examples/train_ms_gpt.py`` (a small GPT written the
way MindFormers' models are, compiled forward and backward, ``AdamWeightDecay`` on a warm-up
then cosine schedule, gradient clipping) launched with ``msrun`` in 2 pods x 1 rank, on
MindSpore's own dynamic cluster (a Scheduler beside node rank 0's ranks) and its own
``AllReduce``. One run takes a fault for each rung a MindSpore job has (HCCE and UCE retry in
process, RSC restart from a checkpoint, TTP last words) and ends bitwise equal to the fault-free
run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    assert_no_processes_left,
    events,
    of_kind,
    run_job,
)

pytest.importorskip("mindspore", reason="MindSpore is not installed (unbroken[mindspore])")

pytestmark = pytest.mark.e2e

JOB = FIXTURES / "ms-job.yaml"
FAULTS = FIXTURES / "ms-faults.yaml"
STEPS = 12


def result(run_dir: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((run_dir / "result.json").read_text())
    return data


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    run_dir = tmp_path_factory.mktemp("ms-fault-free") / "run"
    res = run_job(run_dir, job=JOB)
    assert_no_processes_left(run_dir)
    assert res.rc == 0, res.explain()
    assert "job e2e-ms: SUCCEEDED" in res.stdout, res.explain()
    assert "0 fault(s), 0 recovery(ies)" in res.stdout, res.explain()
    # The Scheduler ran beside node rank 0's ranks, as msrun runs it.
    scheduler_log = run_dir / "pods" / "e2e-ms-master-0" / "logs" / "scheduler.log"
    assert "Cluster is successfully initialized" in scheduler_log.read_text()
    return result(run_dir)


def test_the_fault_free_run_trains_every_step(fault_free: dict[str, object]) -> None:
    assert fault_free["steps"] == STEPS
    assert fault_free["world_size"] == 2
    assert fault_free["start_step"] == 0


def test_retry_restart_and_last_words_end_with_the_fault_free_state(
    tmp_path: Path, fault_free: dict[str, object]
) -> None:
    run_dir = tmp_path / "run"
    res = run_job(run_dir, "--chaos", FAULTS, job=JOB)
    assert_no_processes_left(run_dir)
    assert res.rc == 0, res.explain()
    assert f"step {STEPS}/{STEPS}" in res.stdout, res.explain()
    # HCCE and UCE: the steps were redone in the running processes, no fault for the policy.
    redone = of_kind(events(run_dir), "StepRedone")
    assert [(e["rank"], e["step"], e["failure"]) for e in redone] == [
        (0, 2, "link"),
        (1, 4, "device memory"),
    ], res.explain()
    # Two faults left: the SIGKILL (from the checkpoint of step 4, 3 steps recomputed) and the
    # exception (from rank 0's last words of step 10, nothing recomputed); every rank restarted.
    assert "2 fault(s), 2 recovery(ies)" in res.stdout, res.explain()
    decisions = of_kind(events(run_dir), "DecisionMade")
    assert [d["strategy"] for d in decisions] == ["process-restart"] * 2, res.explain()
    assert all(
        "MindSpore ranks cannot leave a broken communicator" in d["reason"] for d in decisions
    )
    loaded = [e["step"] for e in of_kind(events(run_dir), "StateLoaded") if e["generation"] > 0]
    assert loaded == [4, 10], res.explain()
    last_words = [e for e in of_kind(events(run_dir), "CheckpointSaved") if e["last_words"]]
    assert [e["step"] for e in last_words] == [10], res.explain()
    # The result: bit for bit the fault-free run's, from a process that resumed at step 10.
    final = result(run_dir)
    assert final["start_step"] == 10
    assert final["digest"] == fault_free["digest"]


def test_a_failed_device_moves_its_pod_and_every_rank_resumes_from_the_checkpoint(
    tmp_path: Path, fault_free: dict[str, object]
) -> None:
    """Pod-level rescheduling (RSC): the pod of the failed device is placed again off it, the
    other pod's rank restarts in place, and MindSpore's cluster is built anew."""
    run_dir = tmp_path / "run"
    cluster = FIXTURES / "cluster-fast-watch.yaml"
    res = run_job(run_dir, "--cluster", cluster, "--chaos", FIXTURES / "ms-device.yaml", job=JOB)
    assert_no_processes_left(run_dir)
    assert res.rc == 0, res.explain()
    assert "1 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    (decision,) = of_kind(events(run_dir), "DecisionMade")
    assert decision["strategy"] == "pod-rescheduling", res.explain()
    loaded = [e["step"] for e in of_kind(events(run_dir), "StateLoaded") if e["generation"] > 0]
    assert len(loaded) == 1 and loaded[0] in (4, 8), res.explain()  # the newest checkpoint
    assert result(run_dir)["digest"] == fault_free["digest"]
