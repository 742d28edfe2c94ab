"""``unbroken run`` of a job whose state is sharded with no replica of a shard (FSDP2 over 4
ranks, ZeRO over DDP on 4 ranks): each rank's session says up front that it cannot be repaired
in process, so a SIGKILLed rank takes the job to the checkpoint rung (every rank restarts from
the newest sharded checkpoint) instead of an in-process rung that could not restore the lost
shard; the run ends bitwise equal to its fault-free run, having recomputed the steps since that
checkpoint. HSDP, and ZeRO with a replica optimizer, hold every shard twice and recover in
process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    REPO,
    Reference,
    assert_no_processes_left,
    digest,
    events,
    of_kind,
    run_job,
    write_job,
)
from tests.support.process_helpers import (
    rank_pids,
    recomputed_steps,
    split_at_fault,
    started_ranks,
    the_incident,
)

pytestmark = pytest.mark.e2e

SHARDED = FIXTURES / "sharded.yaml"
#: A node loss takes the lost pod to the spare node (the fixtures' jobs leave it off).
POD_RESCHEDULING = {
    'fault-scheduling: "grace"': 'fault-scheduling: "grace"\n    pod-rescheduling: "on"'
}
KILL = FIXTURES / "kill-rank.yaml"  # SIGKILL rank 3 after it commits step 25


def _sharded_job(path: Path, parallel: str) -> Path:
    return write_job(
        path,
        job=SHARDED,
        replace={
            "../../../examples/train_sharded.py": str(REPO / "examples" / "train_sharded.py"),
            "--parallel=fsdp": f"--parallel={parallel}",
        },
    )


def _fault_free(base: Path, parallel: str) -> Reference:
    base.mkdir(parents=True, exist_ok=True)
    job = _sharded_job(base / "job.yaml", parallel)
    res = run_job(base / "run", job=job)
    assert res.rc == 0 and "0 fault(s)" in res.stdout, res.explain()
    return Reference(base / "run", digest(base / "run"))


@pytest.fixture(scope="module")
def zero_fault_free(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The ZeRO job run once without faults; with a replica optimizer it trains the same."""
    return _fault_free(tmp_path_factory.mktemp("zero-fault-free"), "zero")


@pytest.fixture(scope="module")
def fsdp_fault_free(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The FSDP2 job run once without faults (pod-level rescheduling on or off, it trains the
    same)."""
    return _fault_free(tmp_path_factory.mktemp("fsdp-fault-free"), "fsdp")


@pytest.mark.parametrize("parallel", ["fsdp", "zero"])
def test_lost_shard_without_replica_restarts_from_the_checkpoint_exactly(
    tmp_path: Path, parallel: str, request: pytest.FixtureRequest
) -> None:
    job = _sharded_job(tmp_path / "job.yaml", parallel)
    reference: Reference = request.getfixturevalue(f"{parallel}_fault_free")

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
    assert digest(faulted) == reference.digest
    # Every rank logged why its shard cannot be repaired in process.
    logs = sorted(faulted.glob("pods/*/logs/rank*.log"))
    assert len(logs) == 4
    for log in logs:
        assert "a lost rank's shard has no replica on another rank" in log.read_text()


def test_fsdp_lost_node_restarts_from_the_checkpoint_on_the_spare_node(
    tmp_path: Path, fsdp_fault_free: Reference
) -> None:
    """FSDP2 over all ranks, node-1 lost: its ranks' shards have no replica anywhere, so the
    worker pod goes to the spare node and every rank resumes from the newest checkpoint."""
    job = write_job(
        tmp_path / "job.yaml",
        job=SHARDED,
        replace={
            "../../../examples/train_sharded.py": str(REPO / "examples" / "train_sharded.py"),
            **POD_RESCHEDULING,
        },
    )
    reference = fsdp_fault_free
    faulted = tmp_path / "faulted"
    res = run_job(faulted, "--chaos", FIXTURES / "kill-node.yaml", job=job)
    assert res.rc == 0, res.explain()
    assert "job e2e-sharded: SUCCEEDED" in res.stdout, res.explain()
    evs = events(faulted)
    incident = the_incident(evs)
    assert incident[0]["source"] == "node-lost", incident[0]
    assert incident[1]["strategy"] == "pod-rescheduling", incident[1]
    assert of_kind(incident, "ProcessesStarted", pod="e2e-sharded-worker-0", node="node-2")
    (loaded,) = [e for e in of_kind(evs, "StateLoaded") if e["generation"] == 1]
    assert (loaded["source"], loaded["step"]) == ("checkpoint", 20), loaded
    assert digest(faulted) == reference.digest
    # process-recover-enable: pause while the pod is rescheduled, on once generation 1 trains.
    fault_id = incident[0]["fault_id"]
    assert of_kind(evs, "ProcessRecoverPaused", fault_id=fault_id, rescheduling="pod-rescheduling")
    assert len(of_kind(evs, "ProcessRecoverResumed", generation=1)) == 1, evs
    kinds = [e["kind"] for e in evs]
    assert kinds.index("ProcessRecoverPaused") < kinds.index("ProcessRecoverResumed"), kinds


# -- HSDP: the shards have replicas, so the in-process rungs take the fault ----------------------

HSDP = FIXTURES / "sharded-hsdp.yaml"  # recover-in-place; replica groups {0, 1} and {2, 3}
HSDP_SCRIPT = {"../../../examples/train_sharded.py": str(REPO / "examples" / "train_sharded.py")}
HSDP_WORKER = "e2e-hsdp-worker-0"


@pytest.fixture(scope="module")
def hsdp_fault_free(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The HSDP job run once without faults (every faulted HSDP run must end with its model)."""
    base = tmp_path_factory.mktemp("hsdp-fault-free")
    job = write_job(base / "job.yaml", job=HSDP, replace=HSDP_SCRIPT)
    res = run_job(base / "run", job=job)
    assert res.rc == 0 and "0 fault(s)" in res.stdout, res.explain()
    assert_no_processes_left(base / "run")
    return Reference(base / "run", digest(base / "run"))


def assert_healthy_ranks_kept_their_processes(
    evs: list[dict[str, Any]], replaced: list[int]
) -> None:
    before, after = split_at_fault(evs)
    assert started_ranks(after) == replaced, of_kind(after, "ProcessesStarted")
    old, final = rank_pids(before), rank_pids(evs)
    healthy = [r for r in range(4) if r not in replaced]
    assert {r: final[r] for r in healthy} == {r: old[r] for r in healthy}, (old, final)
    assert all(final[r] != old[r] for r in replaced), (old, final)


def _run_with_rank_3_killed(
    run_dir: Path, tmp_path: Path, spec: Path, name: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run the job ``spec`` (named ``name``) with rank 3 SIGKILLed after step 25, and check
    that the run succeeded after exactly one fault and one recovery, the fault being that
    kill. Returns the run's events and its one incident, for the checks of how it recovered."""
    job = write_job(tmp_path / "job.yaml", job=spec, replace=HSDP_SCRIPT)
    res = run_job(run_dir, "--chaos", KILL, job=job)
    assert res.rc == 0, res.explain()
    assert f"job {name}: SUCCEEDED" in res.stdout, res.explain()
    assert "1 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    evs = events(run_dir)
    incident = the_incident(evs)
    assert incident[0]["code"] == "signal:SIGKILL" and incident[0]["ranks"] == [3], incident[0]
    return evs, incident


def test_hsdp_killed_rank_is_recovered_in_place_from_its_replica(
    run_dir: Path, tmp_path: Path, hsdp_fault_free: Reference
) -> None:
    evs, incident = _run_with_rank_3_killed(run_dir, tmp_path, HSDP, "e2e-hsdp")
    decision = incident[1]
    assert decision["strategy"] == "recover-in-place", decision
    assert decision["commands"] == [f"RestartInPlace(pod='{HSDP_WORKER}', ranks=(3,))"]
    (loaded,) = of_kind(incident, "StateLoaded")
    # Rank 3's shard came from rank 1, its replica in the other replica group.
    assert (loaded["generation"], loaded["source"]) == (1, "replica"), loaded
    assert recomputed_steps(run_dir) == 0
    assert_healthy_ranks_kept_their_processes(evs, replaced=[3])
    assert digest(run_dir) == hsdp_fault_free.digest
    log = (run_dir / "pods" / HSDP_WORKER / "logs" / "rank3.log").read_text()
    assert "recovered into generation 1 at step 25 (state from rank 1)" in log, log[-2000:]


def test_hsdp_lost_node_is_recovered_on_the_spare_node_from_the_other_replica_group(
    run_dir: Path, tmp_path: Path, hsdp_fault_free: Reference
) -> None:
    incident = _node_1_lost_and_recovered_in_process(
        run_dir,
        tmp_path,
        HSDP,
        "e2e-hsdp",
        hsdp_fault_free,
        {'recover-strategy: "recover-in-place"': 'recover-strategy: "recover"'},
    )
    assert of_kind(incident, "ProcessesStarted", pod=HSDP_WORKER, node="node-2", generation=1)
    (loaded,) = of_kind(incident, "StateLoaded")
    # The whole replica group {2, 3} was lost: each shard came from its holder in {0, 1}.
    assert loaded["step"] == incident[0]["step"], (loaded, incident[0])


def _node_1_lost_and_recovered_in_process(
    run_dir: Path,
    tmp_path: Path,
    spec: Path,
    name: str,
    reference: Reference,
    replace: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Run the job ``spec`` (named ``name``) with node-1 (ranks 2 and 3) lost at step 25 and
    pod-level rescheduling on; check that ``recover`` brought the pod up on the spare node with
    its state from the replicas, every survivor kept, no step recomputed and ``reference``'s
    model at the end. Returns the incident, for the checks of how it recovered."""
    job = write_job(
        tmp_path / "job.yaml",
        job=spec,
        replace={
            **HSDP_SCRIPT,
            **POD_RESCHEDULING,
            "--step-sleep=0.02": "--step-sleep=0.05",  # the spare agent is up before step 25
            **(replace or {}),
        },
    )
    res = run_job(run_dir, "--chaos", FIXTURES / "kill-node.yaml", job=job)
    assert res.rc == 0, res.explain()
    assert f"job {name}: SUCCEEDED" in res.stdout, res.explain()
    assert "1 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    evs = events(run_dir)
    incident = the_incident(evs)
    assert incident[0]["source"] == "node-lost" and incident[0]["ranks"] == [2, 3], incident[0]
    assert incident[1]["strategy"] == "recover", incident[1]
    (loaded,) = of_kind(incident, "StateLoaded")
    assert (loaded["generation"], loaded["source"]) == (1, "replica"), loaded
    assert recomputed_steps(run_dir) == 0
    assert_healthy_ranks_kept_their_processes(evs, replaced=[2, 3])
    assert digest(run_dir) == reference.digest
    return incident


def test_hsdp_device_memory_error_is_retried_from_the_replica_in_every_process(
    run_dir: Path, tmp_path: Path, hsdp_fault_free: Reference
) -> None:
    """The ``retry`` rung: rank 2's parameter shard is corrupt at step 25 (the step fails before
    it shares anything); no process restarts, its shard comes from rank 0."""
    job = write_job(
        tmp_path / "job.yaml",
        job=HSDP,
        replace={
            **HSDP_SCRIPT,
            'recover-strategy: "recover-in-place"': 'recover-strategy: "retry,recover-in-place"',
        },
    )
    res = run_job(run_dir, "--chaos", FIXTURES / "memory-rank.yaml", job=job)
    assert res.rc == 0, res.explain()
    assert "1 fault(s), 1 recovery(ies)" in res.stdout, res.explain()

    evs = events(run_dir)
    incident = the_incident(evs)
    assert incident[0]["source"] == "device-memory" and incident[0]["ranks"] == [2], incident[0]
    assert incident[1]["strategy"] == "retry", incident[1]
    (loaded,) = of_kind(incident, "StateLoaded")
    assert (loaded["generation"], loaded["step"], loaded["source"]) == (1, 25, "replica"), loaded
    assert recomputed_steps(run_dir) == 0
    assert_healthy_ranks_kept_their_processes(evs, replaced=[])
    assert digest(run_dir) == hsdp_fault_free.digest


# -- op retry: a link fault inside the step's collectives is re-executed, not recovered ---------

OP_RETRY_ENV = (
    "- name: ascend\n              env:\n"
    "                - name: HCCL_OP_RETRY_ENABLE\n"
    '                  value: "L0:1, L1:1, L2:1"\n'
    "                - name: HCCL_OP_RETRY_PARAMS\n"
    '                  value: "MaxCnt:3, HoldTime:200, IntervalTime:200"\n'
    "              command:"
)
LINK = FIXTURES / "chaos-link.yaml"  # rank 2's links reset before its step 20


def _link_fault_is_re_executed(run_dir: Path, job: Path, reference: Reference) -> list[str]:
    """Run ``job`` with rank 2's links reset before step 20; returns the ranks' logs."""
    res = run_job(run_dir, "--chaos", LINK, job=job)
    assert res.rc == 0, res.explain()
    assert "step 40/40; 0 fault(s), 0 recovery(ies)" in res.stdout, res.explain()
    evs = events(run_dir)
    retried = of_kind(evs, "OpRetry")
    assert {e["rank"] for e in retried} == {0, 1, 2, 3}, retried
    assert {e["step"] for e in retried} == {20}, retried
    assert not of_kind(evs, "FaultDetected") and not of_kind(evs, "DecisionMade")
    assert started_ranks(evs) == [0, 1, 2, 3]  # no process was started again
    assert digest(run_dir) == reference.digest
    logs = [log.read_text() for log in sorted(run_dir.glob("pods/*/logs/rank*.log"))]
    assert len(logs) == 4
    return logs


def test_hsdp_link_fault_in_the_mesh_collectives_is_re_executed_by_op_retry(
    run_dir: Path, tmp_path: Path, hsdp_fault_free: Reference
) -> None:
    """FSDP2's all-gathers and reduce-scatters, the clipped gradients' norm and the logged
    loss all go through the session's groups: with op retry on, the failed ones are issued
    again over new groups of the same ranks and the step goes on in every process."""
    job = write_job(
        tmp_path / "job.yaml",
        job=HSDP,
        replace={**HSDP_SCRIPT, "- name: ascend\n              command:": OP_RETRY_ENV},
    )
    for log in _link_fault_is_re_executed(run_dir, job, hsdp_fault_free):
        assert "the collectives of step 20 issued again (op retry 1/3" in log, log[-3000:]


# -- ZeRO with a replica optimizer: every partition is held twice --------------------------------

ZERO_REPLICA = FIXTURES / "sharded-zero-replica.yaml"  # every rung; ZeRO-1 with replicas


def test_zero_with_replica_optimizer_recovers_a_killed_rank_in_place(
    run_dir: Path, tmp_path: Path, zero_fault_free: Reference
) -> None:
    """Rank 3's optimizer partition comes from rank 0's replica of it, its replica of
    partition 2 from rank 2; the model and the rest from the command's source. The run ends
    bitwise equal to the fault-free ZeRO run without replicas (they train alike)."""
    evs, incident = _run_with_rank_3_killed(run_dir, tmp_path, ZERO_REPLICA, "e2e-zero")
    assert incident[1]["strategy"] == "recover-in-place", incident[1]
    (loaded,) = of_kind(incident, "StateLoaded")
    assert (loaded["generation"], loaded["source"]) == (1, "replica"), loaded
    assert recomputed_steps(run_dir) == 0
    assert_healthy_ranks_kept_their_processes(evs, replaced=[3])
    assert digest(run_dir) == zero_fault_free.digest


def test_zero_with_replica_optimizer_recovers_a_lost_node_on_the_spare_node(
    run_dir: Path, tmp_path: Path, zero_fault_free: Reference
) -> None:
    """Node-1 (ranks 2 and 3, a whole pod) is lost: each lost partition comes from its replica
    on node-0 (the replicas live a node's ranks on), the replacements' replicas from node-0's
    partitions; every survivor keeps its process and no step is recomputed. The node dies
    wherever its ranks are in step 26: before the gradients are shared (the survivors' step
    fails whole), or while ZeRO broadcasts the updated partitions (a survivor took the update,
    so the repair completes it from node-0's partitions and replicas first: "completing the
    update of step 26" in their logs); either way the same model at the end."""
    _node_1_lost_and_recovered_in_process(
        run_dir, tmp_path, ZERO_REPLICA, "e2e-zero", zero_fault_free
    )


def test_zero_link_fault_in_the_optimizer_broadcast_is_re_executed_by_op_retry(
    run_dir: Path, tmp_path: Path, zero_fault_free: Reference
) -> None:
    """The gradient all-reduce fails first and is re-executed by the DDP hook's op retry;
    ZeroRedundancyOptimizer's broadcast of the updated partitions then fails inside
    ``optimizer.step()`` and is issued again over the session's new groups: no recovery."""
    job = write_job(
        tmp_path / "job.yaml",
        job=ZERO_REPLICA,
        replace={**HSDP_SCRIPT, "- name: ascend\n              command:": OP_RETRY_ENV},
    )
    for log in _link_fault_is_re_executed(run_dir, job, zero_fault_free):
        assert "gradient all-reduce of step 20 re-executed (op retry 1/3" in log, log[-3000:]
        assert "broadcast over ranks [0, 1, 2, 3] of step 20 failed" in log, log[-3000:]
        assert "the collectives of step 20 issued again (op retry 1/3" in log, log[-3000:]


# -- DDP, with the same loop: the sharded layouts recover as it does ------------------------------

DDP_SCRIPT = {**HSDP_SCRIPT, "--parallel=hsdp": "--parallel=ddp"}


@pytest.fixture(scope="module")
def ddp_fault_free(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    base = tmp_path_factory.mktemp("ddp-fault-free")
    job = write_job(base / "job.yaml", job=HSDP, replace=DDP_SCRIPT)
    res = run_job(base / "run", job=job)
    assert res.rc == 0 and "0 fault(s)" in res.stdout, res.explain()
    return Reference(base / "run", digest(base / "run"))


@pytest.mark.parametrize("fault", ["kill", "node"])
def test_ddp_loop_with_clipping_and_logged_collectives_recovers_in_process(
    run_dir: Path, tmp_path: Path, ddp_fault_free: Reference, fault: str
) -> None:
    """The loop clips gradients and all-reduces and gathers for its log after the update: a
    rank killed (recover-in-place) or a node lost (recover on the spare node) costs no
    healthy process and no step, and the run ends with the fault-free model."""
    replace = dict(DDP_SCRIPT)
    chaos = KILL
    if fault == "node":
        chaos = FIXTURES / "kill-node.yaml"
        replace.update(
            {
                'recover-strategy: "recover-in-place"': 'recover-strategy: "recover"',
                **POD_RESCHEDULING,
                "--step-sleep=0.02": "--step-sleep=0.05",
            }
        )
    job = write_job(tmp_path / "job.yaml", job=HSDP, replace=replace)
    res = run_job(run_dir, "--chaos", chaos, job=job)
    assert res.rc == 0, res.explain()
    assert "1 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    evs = events(run_dir)
    incident = the_incident(evs)
    expected = "recover-in-place" if fault == "kill" else "recover"
    assert incident[1]["strategy"] == expected, incident[1]
    assert recomputed_steps(run_dir) == 0
    assert_healthy_ranks_kept_their_processes(evs, replaced=[3] if fault == "kill" else [2, 3])
    assert digest(run_dir) == ddp_fault_free.digest
