"""``unbroken run`` with process-level recovery: 2 pods x 2 ranks of examples/train_mlp.py on
gloo, one spare node. A killed or failed rank (``recover-in-place``) or the pod of a lost node
(``recover``) is replaced while the healthy ranks go on in the same processes: the replacement
takes its state from a healthy replica at the step of the fault, no step is trained twice, and
the final model is the fault-free one, bit for bit. When the configured rung cannot handle a
fault, the next rung of the decision table does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    JOB,
    SLOW_STEP_SLEEP,
    STEP_SLEEP,
    TRAIN_SCRIPT,
    Reference,
    digest,
    events,
    of_kind,
    replica_specs,
    run_job,
    start_job,
    status,
    unbroken,
    wait_for,
    write_job,
)
from tests.support.process_helpers import (
    rank_pids,
    recomputed_steps,
    split_at_fault,
    started_ranks,
    status_rank_pids,
    the_incident,
)

pytestmark = pytest.mark.e2e

IN_PLACE = FIXTURES / "process-recover-in-place.yaml"
RECOVER = FIXTURES / "process-recover.yaml"
NO_SPARE = FIXTURES / "process-cluster-no-spare.yaml"
DUMP = FIXTURES / "process-dump.yaml"
RETRY = FIXTURES / "process-retry.yaml"
RETRY_MASTER, RETRY_WORKER = "e2e-retry-master-0", "e2e-retry-worker-0"
DUMP_MASTER, DUMP_WORKER = "e2e-dump-master-0", "e2e-dump-worker-0"
RANKS = [0, 1, 2, 3]
IN_PLACE_MASTER, IN_PLACE_WORKER = "e2e-inplace-master-0", "e2e-inplace-worker-0"
RECOVER_MASTER, RECOVER_WORKER = "e2e-recover-master-0", "e2e-recover-worker-0"
# An incident recovered without stopping a pod or placing one, in order (process starts aside).
IN_PROCESS_PHASES = [
    "FaultDetected",
    "DecisionMade",
    "CommunicationReady",
    "StateLoaded",
    "FirstStepCommitted",
    "RecoveryCompleted",
]


@pytest.fixture(scope="module")
def reference(fault_free: Reference) -> Reference:
    """The e2e job's fault-free run. The process-level jobs differ from it only in their
    metadata (name, labels, fault-handling annotations), so its model is the one every faulted
    run of theirs must end with, bit for bit."""
    for job in (IN_PLACE, RECOVER, RETRY, DUMP):
        assert replica_specs(job) == replica_specs(JOB), f"{job} trains another model than {JOB}"
    return fault_free


def result_of(run_dir: Path) -> dict[str, Any]:
    """What rank 0 wrote at the end (``--result``)."""
    data: dict[str, Any] = json.loads((run_dir / "result.json").read_text())
    return data


def assert_succeeded(stdout: str, job: str, run_dir: Path, reference: Reference) -> None:
    assert f"job {job}: SUCCEEDED" in stdout, stdout
    assert "step 60/60; 1 fault(s), 1 recovery(ies)" in stdout, stdout
    assert digest(run_dir) == reference.digest, "the recovered model differs from the fault-free"
    st = status(run_dir)
    assert st is not None and st["phase"] == "Succeeded" and st["step"] == 60, st


def assert_only_replaced_ranks_restarted(
    evs: list[dict[str, Any]], run_dir: Path, replaced: list[int]
) -> None:
    """After the fault only ``replaced`` ranks were started again; every other rank ended the
    job in the process it had before the fault (by the ledger and by ``unbroken status``), and
    rank 0's own process trained from step 0 to the end."""
    before, after = split_at_fault(evs)
    assert started_ranks(before) == RANKS, before
    assert started_ranks(after) == replaced, of_kind(after, "ProcessesStarted")
    old, final = rank_pids(before), rank_pids(evs)
    healthy = [r for r in RANKS if r not in replaced]
    assert {r: final[r] for r in healthy} == {r: old[r] for r in healthy}
    assert all(final[r] != old[r] for r in replaced), (old, final)
    st = status(run_dir)
    assert st is not None and status_rank_pids(st) == final, (st, final)
    assert result_of(run_dir)["start_step"] == 0, result_of(run_dir)


def test_killed_rank_is_recovered_in_place_from_a_replica(
    run_dir: Path, reference: Reference
) -> None:
    res = run_job(run_dir, "--chaos", FIXTURES / "kill-rank.yaml", job=IN_PLACE)
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, "e2e-inplace", run_dir, reference)

    evs = events(run_dir)
    incident = the_incident(evs)
    kinds = [e["kind"] for e in incident]
    fault = incident[0]
    assert fault["source"] == "process-exit" and fault["code"] == "signal:SIGKILL", fault
    assert fault["ranks"] == [3] and fault["pods"] == [IN_PLACE_WORKER], fault
    assert fault["step"] == 25, fault
    decision = incident[1]
    assert decision["kind"] == "DecisionMade" and decision["strategy"] == "recover-in-place"
    assert decision["commands"] == [f"RestartInPlace(pod='{IN_PLACE_WORKER}', ranks=(3,))"]
    assert [k for k in kinds if k != "ProcessesStarted"] == IN_PROCESS_PHASES, kinds
    assert of_kind(incident, "ProcessesStarted", pod=IN_PLACE_WORKER, ranks=[3], generation=1)
    loaded = of_kind(incident, "StateLoaded")[0]
    assert (loaded["generation"], loaded["step"], loaded["source"]) == (1, 25, "replica")
    first = of_kind(incident, "FirstStepCommitted")[0]
    assert (first["generation"], first["step"]) == (1, 26), first
    assert incident[-1]["strategy"] == "recover-in-place", incident[-1]
    assert recomputed_steps(run_dir) == 0
    assert_only_replaced_ranks_restarted(evs, run_dir, replaced=[3])


def test_rank_that_raised_is_recovered_in_place_from_a_replica(
    run_dir: Path, reference: Reference
) -> None:
    res = run_job(run_dir, "--chaos", FIXTURES / "exception-rank.yaml", job=IN_PLACE)
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, "e2e-inplace", run_dir, reference)

    evs = events(run_dir)
    incident = the_incident(evs)
    kinds = [e["kind"] for e in incident]
    fault = incident[0]
    assert fault["source"] == "exception" and fault["code"] == "InjectedFault", fault
    assert fault["ranks"] == [1] and fault["pods"] == [IN_PLACE_MASTER], fault
    assert "InjectedFault: injected exception in rank 1 before step 25" in fault["detail"], fault
    decision = incident[1]
    assert decision["kind"] == "DecisionMade" and decision["strategy"] == "recover-in-place"
    # Rank 1 shares its pod with rank 0: only rank 1's process is replaced.
    assert decision["commands"] == [f"RestartInPlace(pod='{IN_PLACE_MASTER}', ranks=(1,))"]
    assert [k for k in kinds if k != "ProcessesStarted"] == IN_PROCESS_PHASES, kinds
    loaded = of_kind(incident, "StateLoaded")[0]
    assert (loaded["generation"], loaded["step"], loaded["source"]) == (1, 25, "replica")
    assert recomputed_steps(run_dir) == 0
    assert_only_replaced_ranks_restarted(evs, run_dir, replaced=[1])


def test_a_sticky_device_error_replaces_the_rank_s_process_in_place(
    run_dir: Path, reference: Reference
) -> None:
    """CUDA error 710 (a device-side assert) in rank 2: the fault is its code, read from the
    exception object and rated by the code table (RestartBusiness: the device is fine, the
    process is not), and ``recover-in-place`` gives the rank a new process."""
    res = run_job(run_dir, "--chaos", FIXTURES / "device-assert-rank.yaml", job=IN_PLACE)
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, "e2e-inplace", run_dir, reference)
    evs = events(run_dir)
    incident = the_incident(evs)
    fault = incident[0]
    assert (fault["code"], fault["level"], fault["source"]) == (
        "CUDA-710",
        "RestartBusiness",
        "device",
    ), fault
    assert fault["ranks"] == [2], fault
    decision = incident[1]
    assert decision["strategy"] == "recover-in-place", decision
    assert decision["commands"] == [f"RestartInPlace(pod='{IN_PLACE_WORKER}', ranks=(2,))"]
    assert_only_replaced_ranks_restarted(evs, run_dir, replaced=[2])


def test_lost_node_is_recovered_on_the_spare_node_from_a_replica(
    run_dir: Path, reference: Reference, tmp_path: Path
) -> None:
    # Slower steps: the spare agent the replacement pod takes starts once the job trains, and
    # must be there by the time the node dies at step 25. The containers are not named
    # "ascend" and set the sunset Elastic Agent's variable: each is warned about, and the job
    # runs as without them.
    sunset = "              env:\n                - name: ELASTIC_PROCESS_RECOVER_ENABLE\n"
    sunset += '                  value: "1"\n'
    trainer = f"            - name: trainer\n{sunset}"
    replace = {STEP_SLEEP: SLOW_STEP_SLEEP, "            - name: ascend\n": trainer}
    job = write_job(tmp_path / "job.yaml", job=RECOVER, replace=replace)
    res = run_job(run_dir, "--chaos", FIXTURES / "kill-node.yaml", job=job)
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, "e2e-recover", run_dir, reference)
    warned = [w for w in res.stderr.splitlines() if w.startswith(f"warning: {job}:")]
    names = [w for w in warned if "no container is named 'ascend'" in w]
    assert [w.split(": ")[2] for w in names] == [
        f"spec.replicaSpecs.{kind}.template.spec.containers[0].name"
        for kind in ("Master", "Worker")
    ], res.explain()
    assert any("Elastic Agent, which is sunset" in w for w in warned), res.explain()

    evs = events(run_dir)
    incident = the_incident(evs)
    fault = incident[0]
    assert fault["source"] == "node-lost" and fault["nodes"] == ["node-1"], fault
    assert fault["pods"] == [RECOVER_WORKER] and fault["ranks"] == [2, 3], fault
    # The node is killed from outside once step 25 is committed: the healthy ranks may commit
    # a step or two more before they notice.
    assert fault["step"] >= 25, fault
    decision = incident[1]
    assert decision["kind"] == "DecisionMade" and decision["strategy"] == "recover", decision
    assert decision["commands"] == [
        f"RecoverOnSpare(pod='{RECOVER_WORKER}', ranks=(2, 3), isolate_devices=(), "
        "isolate_nodes=('node-1',))"
    ], decision
    assert of_kind(incident, "NodeIsolated", node="node-1"), incident
    assert of_kind(incident, "PodsStopped", pods=[RECOVER_WORKER]), incident
    assert [(e["pod"], e["node"]) for e in of_kind(evs, "PodPlaced", generation=1)] == [
        (RECOVER_WORKER, "node-2")
    ]
    assert of_kind(incident, "ProcessesStarted", pod=RECOVER_WORKER, node="node-2", generation=1)
    # The replacement pod took over the warm spare agent waiting on node-2 since the job trained.
    assert of_kind(evs, "SpareStarted", node="node-2"), of_kind(evs, "SpareStarted")
    assert of_kind(incident, "SpareTaken", node="node-2", pod=RECOVER_WORKER), incident
    loaded = of_kind(incident, "StateLoaded")[0]
    assert (loaded["generation"], loaded["step"], loaded["source"]) == (
        1,
        fault["step"],
        "replica",
    ), loaded
    first = of_kind(incident, "FirstStepCommitted")[0]
    assert (first["generation"], first["step"]) == (1, fault["step"] + 1), first
    assert incident[-1]["strategy"] == "recover", incident[-1]
    assert recomputed_steps(run_dir) == 0
    # The master pod's ranks never restart; the worker pod's come back on the spare node.
    assert_only_replaced_ranks_restarted(evs, run_dir, replaced=[2, 3])
    st = status(run_dir)
    assert st is not None
    assert {p["name"]: p["node"] for p in st["pods"]} == {
        RECOVER_MASTER: "node-0",
        RECOVER_WORKER: "node-2",
    }


@pytest.mark.parametrize(
    ("chaos", "code"), [("memory-rank.yaml", "80E01801"), ("oom-rank.yaml", "CUDA-2")]
)
def test_device_memory_error_is_retried_online_in_the_same_processes(
    run_dir: Path, reference: Reference, chaos: str, code: str
) -> None:
    """``retry``: rank 2's memory is corrupted at step 25 (or an allocation on its device
    fails); no process restarts, every rank rejoins a new generation, rank 2 is repaired from a
    healthy replica and the step redone."""
    res = run_job(run_dir, "--chaos", FIXTURES / chaos, job=RETRY)
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, "e2e-retry", run_dir, reference)

    evs = events(run_dir)
    incident = the_incident(evs)
    fault = incident[0]
    assert fault["source"] == "device-memory" and fault["ranks"] == [2], fault
    assert fault["code"] == code, fault
    assert fault["pods"] == [RETRY_WORKER] and fault["step"] == 25, fault
    decision = incident[1]
    assert decision["strategy"] == "retry", decision
    assert decision["commands"] == ["RetryOnline(ranks=(2,))"], decision
    assert [e["kind"] for e in incident] == IN_PROCESS_PHASES, incident
    loaded = of_kind(incident, "StateLoaded")[0]
    assert (loaded["generation"], loaded["step"], loaded["source"]) == (1, 25, "replica")
    assert recomputed_steps(run_dir) == 0
    assert_only_replaced_ranks_restarted(evs, run_dir, replaced=[])


def test_a_retry_that_fails_falls_to_recover(run_dir: Path, reference: Reference) -> None:
    """The memory error strikes again when rank 2 redoes step 25 after the retry: the second
    fault joins the incident, which goes strictly below ``retry``; ``recover-in-place`` takes
    process exits only, so ``recover`` moves rank 2's pod and its new ranks take the state of
    the healthy pod, whose processes never restart."""
    res = run_job(run_dir, "--chaos", FIXTURES / "memory-rank-twice.yaml", job=RETRY)
    assert res.rc == 0, res.explain()
    assert "job e2e-retry: SUCCEEDED" in res.stdout, res.explain()
    assert "step 60/60; 2 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    assert digest(run_dir) == reference.digest

    evs = events(run_dir)
    faults = of_kind(evs, "FaultDetected")
    assert [(f["source"], f["ranks"]) for f in faults] == [("device-memory", [2])] * 2, faults
    decisions = of_kind(evs, "DecisionMade")
    assert [d["strategy"] for d in decisions] == ["retry", "recover"], decisions
    assert decisions[1]["commands"][0].startswith(f"RecoverOnSpare(pod='{RETRY_WORKER}'")
    (done,) = of_kind(evs, "RecoveryCompleted")
    assert done["strategy"] == "recover", done
    assert recomputed_steps(run_dir) == 0
    at = next(i for i, e in enumerate(evs) if e["id"] == faults[0]["id"])
    assert started_ranks(evs[at:]) == [2, 3], of_kind(evs[at:], "ProcessesStarted")
    old, final = rank_pids(evs[:at]), rank_pids(evs)
    assert (final[0], final[1]) == (old[0], old[1]), (old, final)


def test_a_second_fault_during_recovery_falls_to_the_next_rung(
    run_dir: Path, reference: Reference
) -> None:
    """Rank 3 is killed at step 25, and its replacement is killed too as it redoes the step,
    before the recovery committed anything: the incident goes below ``recover-in-place`` to
    the exit path, an in-pod restart from the checkpoint of step 20, and still ends with the
    fault-free model."""
    res = run_job(run_dir, "--chaos", FIXTURES / "kill-rank-twice.yaml", job=IN_PLACE)
    assert res.rc == 0, res.explain()
    assert "job e2e-inplace: SUCCEEDED" in res.stdout, res.explain()
    assert "step 60/60; 2 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    assert digest(run_dir) == reference.digest

    evs = events(run_dir)
    faults = of_kind(evs, "FaultDetected")
    assert [(f["code"], f["ranks"]) for f in faults] == [("signal:SIGKILL", [3])] * 2, faults
    decisions = of_kind(evs, "DecisionMade")
    assert [d["strategy"] for d in decisions] == ["recover-in-place", "process-restart"]
    assert "during recover-in-place" in decisions[1]["reason"], decisions[1]
    (done,) = of_kind(evs, "RecoveryCompleted")
    assert done["strategy"] == "process-restart", done
    loaded = of_kind(evs, "StateLoaded")[-1]
    assert (loaded["step"], loaded["source"]) == (20, "checkpoint"), loaded
    assert recomputed_steps(run_dir) == 25 - 20


def test_a_fault_during_a_checkpoint_save_loses_nothing(
    run_dir: Path, reference: Reference
) -> None:
    """Rank 3 dies right after every rank started the asynchronous checkpoint of step 20: the
    healthy ranks abandon the save stuck on the dead peer, recover in place from a replica,
    and every checkpoint directory left behind is whole (manifest last) or absent."""
    res = run_job(run_dir, "--chaos", FIXTURES / "kill-rank-during-save.yaml", job=IN_PLACE)
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, "e2e-inplace", run_dir, reference)

    evs = events(run_dir)
    incident = the_incident(evs)
    assert incident[0]["step"] == 20 and incident[1]["strategy"] == "recover-in-place"
    loaded = of_kind(incident, "StateLoaded")[0]
    assert (loaded["step"], loaded["source"]) == (20, "replica"), loaded
    assert recomputed_steps(run_dir) == 0
    dirs = sorted((run_dir / "checkpoints").glob("step_????????"))
    assert dirs, "no checkpoint at all"
    for d in dirs:
        manifest = json.loads((d / "MANIFEST.json").read_text())
        assert manifest["world_size"] == 4 and d.name == f"step_{manifest['step']:08d}"
        for f in manifest["files"]:
            assert (d / f["path"]).stat().st_size == f["size"], (d, f)


def test_hang_is_not_recovered_in_place_and_falls_to_in_pod_restart(
    run_dir: Path, reference: Reference
) -> None:
    """recover-in-place takes process exits and exceptions only (row L2 of the decision table):
    a hung rank is neither, software faults are not rescheduled (fault-retry-times 0), so the
    ranks restart in their pods from the newest checkpoint (row L6)."""
    res = run_job(run_dir, "--chaos", FIXTURES / "hang-rank.yaml", job=IN_PLACE)
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, "e2e-inplace", run_dir, reference)

    evs = events(run_dir)
    incident = the_incident(evs)
    fault = incident[0]
    assert fault["source"] == "hang" and fault["code"] == "heartbeat-timeout", fault
    assert fault["ranks"] == [2] and fault["pods"] == [IN_PLACE_WORKER], fault
    decision = incident[1]
    assert decision["kind"] == "DecisionMade" and decision["strategy"] == "process-restart"
    why = "recover-in-place: not every fault is a process exit or exception"
    assert why in decision["reason"], decision
    assert not of_kind(incident, "PodPlaced") and not of_kind(incident, "PodsStopped"), incident
    # Every rank starts again and resumes from the checkpoint of step 20, not from a replica.
    before, after = split_at_fault(evs)
    assert started_ranks(after) == RANKS, of_kind(after, "ProcessesStarted")
    old, final = rank_pids(before), rank_pids(evs)
    assert all(final[r] != old[r] for r in RANKS), (old, final)
    loaded = of_kind(incident, "StateLoaded")[0]
    assert (loaded["generation"], loaded["step"], loaded["source"]) == (1, 20, "checkpoint")
    assert incident[-1]["strategy"] == "process-restart", incident[-1]
    assert recomputed_steps(run_dir) == 25 - 20
    assert result_of(run_dir)["start_step"] == 20, result_of(run_dir)


def test_lost_node_without_a_spare_node_falls_to_job_level_rescheduling(
    run_dir: Path, tmp_path: Path
) -> None:
    """With no free node, ``recover`` and pod-level rescheduling cannot place the pod of the
    lost node: the job falls to job-level rescheduling (rows L3, L5a, L5b of the decision
    table), which stops every pod. A lost node never comes back, so the job fails at once with
    the reason instead of waiting for room that cannot appear."""
    res = run_job(
        run_dir,
        "--cluster",
        NO_SPARE,
        "--chaos",
        FIXTURES / "kill-node.yaml",
        job=RECOVER,
    )
    assert res.rc == 1, res.explain()
    assert (
        "no spare node: recover moves a faulty pod to a free node, and all 2 are taken; "
        "recover will fall to the next rung unless room comes back within "
        "wait-reschedule-timeout (an isolated device healthy again)"
    ) in res.stderr, res.explain()
    assert (
        f"reason: cannot place pod {RECOVER_WORKER}: pod {RECOVER_WORKER} needs 2 healthy "
        f"devices; node-0 goes to pod {RECOVER_MASTER}, node-1 isolated: node lost; "
        "the nodes left cannot hold the job"
    ) in res.stderr, res.explain()
    st = status(run_dir)
    assert st is not None and st["phase"] == "Failed", st
    assert "the nodes left cannot hold the job" in st["message"], st

    evs = events(run_dir)
    _, after = split_at_fault(evs)
    fault = after[0]
    assert fault["source"] == "node-lost" and fault["nodes"] == ["node-1"], fault
    decision = after[1]
    assert decision["kind"] == "DecisionMade", decision
    assert decision["strategy"] == "job-rescheduling", decision
    assert "recover: no spare node free and the pod is not schedulable" in decision["reason"]
    assert "pod-rescheduling: the pod cannot be placed now" in decision["reason"], decision
    assert of_kind(after, "NodeIsolated", node="node-1"), after
    stopped = of_kind(after, "PodsStopped")
    assert [sorted(e["pods"]) for e in stopped] == [[RECOVER_MASTER, RECOVER_WORKER]], stopped
    # Nothing was placed or started again, and the fault was not recovered.
    kinds = [e["kind"] for e in after]
    for kind in ("PodPlaced", "ProcessesStarted", "StateLoaded", "RecoveryCompleted"):
        assert kind not in kinds, kinds
    assert kinds[-1] == "JobFailed", kinds


def dump_only_job(tmp_path: Path) -> Path:
    """The dump fixture with ``recover-strategy: "dump"`` alone."""
    text = DUMP.read_text()
    old = 'recover-strategy: "recover,dump"'
    assert old in text
    text = text.replace(old, 'recover-strategy: "dump"')
    text = text.replace("../../../examples/train_mlp.py", str(TRAIN_SCRIPT))
    path = tmp_path / "dump-only.yaml"
    path.write_text(text)
    return path


def last_words_of(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in of_kind(evs, "CheckpointSaved") if e.get("last_words")]


def test_killed_rank_under_dump_resumes_from_the_last_words(
    run_dir: Path, reference: Reference, tmp_path: Path
) -> None:
    """``dump``: rank 3 dies before step 25; a healthy replica, stopped at the step boundary,
    saves step 25 as the job's checkpoint before anything restarts, and the ranks restart in
    their pods from it (row L6 after the dump of row L5's rule): no step is trained twice,
    though the newest periodic checkpoint is step 20."""
    res = run_job(run_dir, "--chaos", FIXTURES / "kill-rank.yaml", job=dump_only_job(tmp_path))
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, "e2e-dump", run_dir, reference)

    evs = events(run_dir)
    incident = the_incident(evs)
    decision = incident[1]
    assert decision["kind"] == "DecisionMade", decision
    assert decision["commands"][0].startswith("DumpLastWords("), decision
    assert "last words, then in-pod restart" in decision["reason"], decision
    (saved,) = last_words_of(incident)
    assert saved["step"] == 25, saved
    kinds = [e["kind"] for e in incident]
    # The last words are committed before any process starts again.
    assert kinds.index("CheckpointSaved") < kinds.index("ProcessesStarted"), kinds
    loaded = of_kind(incident, "StateLoaded")[0]
    assert (loaded["generation"], loaded["step"], loaded["source"]) == (1, 25, "checkpoint")
    assert recomputed_steps(run_dir) == 0
    assert result_of(run_dir)["start_step"] == 25, result_of(run_dir)
    res = unbroken("events", run_dir, "--incidents")
    assert re.search(r"^  last_words\s+\d+\.\d+ s$", res.stdout, re.MULTILINE), res.stdout


def test_lost_node_without_a_spare_node_falls_to_dump_then_job_level(run_dir: Path) -> None:
    """``recover,dump`` with no free node: ``recover`` cannot place the lost node's pod, so the
    healthy pod's replica saves the interrupted step (``dump``) and the job falls to job-level
    rescheduling, which cannot hold the job on the node left and fails with the reason. The
    last words stay behind: a good checkpoint of the whole job (world size 4) at the step
    the healthy ranks had committed, newer than every periodic one."""
    res = run_job(run_dir, "--cluster", NO_SPARE, "--chaos", FIXTURES / "kill-node.yaml", job=DUMP)
    assert res.rc == 1, res.explain()
    assert "the nodes left cannot hold the job" in res.stderr, res.explain()

    evs = events(run_dir)
    _, after = split_at_fault(evs)
    fault, decision = after[0], after[1]
    assert fault["source"] == "node-lost" and fault["nodes"] == ["node-1"], fault
    assert decision["strategy"] == "job-rescheduling", decision
    assert "recover: no spare node free and the pod is not schedulable" in decision["reason"]
    assert "last words, then job-level rescheduling" in decision["reason"], decision
    assert decision["commands"][0].startswith("DumpLastWords("), decision
    (saved,) = last_words_of(after)
    assert saved["step"] >= 25, saved
    kinds = [e["kind"] for e in after]
    assert kinds.index("CheckpointSaved") < kinds.index("PodsStopped") < kinds.index("JobFailed")
    manifest = json.loads(
        (run_dir / "checkpoints" / f"step_{saved['step']:08d}" / "MANIFEST.json").read_text()
    )
    assert (manifest["step"], manifest["world_size"]) == (saved["step"], 4), manifest
    newest = max(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step_????????"))
    assert newest == saved["step"]


def test_recover_pends_for_room_until_the_isolated_device_is_back(
    run_dir: Path, reference: Reference, tmp_path: Path
) -> None:
    """No spare node: rank 3's device fails (SeparateNPU) at step 5, so its pod needs a node
    and none has room. Room can come back (the device, once healthy), so the pod pends up to
    wait-reschedule-timeout while the healthy ranks wait paused; ``unbroken inject device
    --clear`` brings the device back and the pod is recovered on node-1 from a replica."""
    job = write_job(tmp_path / "job.yaml", job=RECOVER, replace={STEP_SLEEP: "--step-sleep=0.1"})
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes: 2\ndevicesPerNode: 2\ndevicePlugin:\n  listWatchPeriod: 3\n")
    chaos = FIXTURES / "device-isolate.yaml"
    running = start_job(run_dir, tmp_path / "logs", "--cluster", cluster, "--chaos", chaos, job=job)
    try:

        def pending() -> bool:
            assert running.proc.poll() is None, "the job ended first: " + str(running.output())
            return "pend(s) for room until recover's deadline" in running.output()[0]

        wait_for(pending, "the pod to pend for room", deadline_s=120.0)
        clear = unbroken(
            "inject", "device", "--node", "node-1", "--device", "1", "--clear", "--run", run_dir
        )
        assert clear.rc == 0, clear.explain()
        done = running.wait()
    finally:
        running.stop()
    assert done.rc == 0, done.explain()
    assert_succeeded(done.stdout, "e2e-recover", run_dir, reference)
    assert "room for e2e-recover-worker-0 within wait-reschedule-timeout" in done.stdout
    evs = events(run_dir)
    incident = the_incident(evs)
    assert [d["strategy"] for d in of_kind(incident, "DecisionMade")] == ["recover"], incident
    assert [(e["pod"], e["node"]) for e in of_kind(evs, "PodPlaced", generation=1)] == [
        (RECOVER_WORKER, "node-1")
    ]
    (loaded,) = of_kind(incident, "StateLoaded")
    assert (loaded["generation"], loaded["source"]) == (1, "replica"), loaded
    assert recomputed_steps(run_dir) == 0
