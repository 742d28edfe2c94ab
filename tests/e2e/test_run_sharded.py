"""``unbroken run`` of a job whose state is sharded with no replica of a shard (FSDP2 over 4
ranks, ZeRO over DDP on 4 ranks): each rank's session says up front that it cannot be repaired
in process, so a SIGKILLed rank takes the job to the checkpoint rung (every rank restarts from
the newest sharded checkpoint) instead of an in-process rung that could not restore the lost
shard; the run ends bitwise equal to its fault-free run, having recomputed the steps since that
checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import FIXTURES, REPO, digest, events, of_kind, run_job, write_job

pytestmark = pytest.mark.e2e

SHARDED = FIXTURES / "sharded.yaml"
KILL = FIXTURES / "kill-rank.yaml"  # SIGKILL rank 3 after it commits step 25


@pytest.mark.parametrize("parallel", ["fsdp", "zero"])
def test_lost_shard_without_replica_restarts_from_the_checkpoint_exactly(
    tmp_path: Path, parallel: str
) -> None:
    job = write_job(
        tmp_path / "job.yaml",
        job=SHARDED,
        replace={
            "../../../examples/train_sharded.py": str(REPO / "examples" / "train_sharded.py"),
            "--parallel=fsdp": f"--parallel={parallel}",
        },
    )
    fault_free = tmp_path / "fault-free"
    res = run_job(fault_free, job=job)
    assert res.rc == 0 and "0 fault(s)" in res.stdout, res.explain()

    faulted = tmp_path / "faulted"
    res = run_job(faulted, "--chaos", KILL, job=job)
    assert res.rc == 0, res.explain()
    assert "job e2e-sharded: SUCCEEDED" in res.stdout, res.explain()

    evs = events(faulted)
    (decision,) = of_kind(evs, "DecisionMade")
    assert decision["strategy"] == "process-restart", decision
    assert "rank(s) 0, 1, 2, 3 cannot be repaired in process" in decision["reason"]
    (loaded,) = [e for e in of_kind(evs, "StateLoaded") if e["generation"] == 1]
    assert (loaded["source"], loaded["step"]) == ("checkpoint", 20)
    assert digest(faulted) == digest(fault_free)
    # Every rank logged why its shard cannot be repaired in process.
    logs = sorted(faulted.glob("pods/*/logs/rank*.log"))
    assert len(logs) == 4
    for log in logs:
        assert "a lost rank's shard has no replica on another rank" in log.read_text()
