"""``unbroken run`` through real faults: 2 pods x 2 ranks of examples/train_mlp.py on gloo, one
spare node. Each faulted run must finish with the fault-free run's model, bit for bit, and its
ledger must tell what happened and how the job recovered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    SLOW_STEP_SLEEP,
    STEP_SLEEP,
    Reference,
    digest,
    events,
    of_kind,
    run_job,
    status,
    unbroken,
    write_job,
)
from tests.support.process_helpers import the_incident

pytestmark = pytest.mark.e2e

MASTER, WORKER = "e2e-mlp-master-0", "e2e-mlp-worker-0"


def assert_succeeded(res_stdout: str, run_dir: Path, reference: Reference) -> None:
    assert "job e2e-mlp: SUCCEEDED" in res_stdout
    assert "step 60/60; 1 fault(s), 1 recovery(ies)" in res_stdout
    assert digest(run_dir) == reference.digest, "the recovered model differs from the fault-free"
    st = status(run_dir)
    assert st is not None and st["phase"] == "Succeeded" and st["step"] == 60, st


def polled_job(tmp_path: Path) -> Path:
    """The e2e job with slower steps: a device fault at step 5 reaches the device plugin's
    next poll (every 3 s) while the job still trains."""
    return write_job(tmp_path / "job.yaml", replace={STEP_SLEEP: SLOW_STEP_SLEEP})


def recomputed_steps(run_dir: Path) -> int:
    res = unbroken("events", run_dir, "--incidents")
    assert res.rc == 0, res.explain()
    found = re.findall(r"^\s+recomputed\s+(\d+) steps$", res.stdout, re.MULTILINE)
    assert len(found) == 1, res.stdout
    return int(found[0])


def test_killed_rank_restarts_in_its_pod_from_the_checkpoint(
    run_dir: Path, fault_free: Reference
) -> None:
    res = run_job(run_dir, "--chaos", FIXTURES / "kill-rank.yaml")
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, run_dir, fault_free)

    evs = events(run_dir)
    incident = the_incident(evs)
    kinds = [e["kind"] for e in incident]
    fault = incident[0]
    assert fault["source"] == "process-exit" and fault["code"] == "signal:SIGKILL", fault
    assert fault["ranks"] == [3] and fault["pods"] == [WORKER] and fault["step"] == 25, fault
    # Software fault, fault-retry-times 0: every rank restarts in its pod, nothing moves.
    decision = incident[1]
    assert decision["kind"] == "DecisionMade" and decision["strategy"] == "process-restart"
    assert "PodPlaced" not in kinds and "PodsStopped" not in kinds, kinds
    restarted = of_kind(incident, "ProcessesStarted", generation=1)
    assert sorted(e["pod"] for e in restarted) == [MASTER, WORKER], restarted
    phases = [k for k in kinds if k != "ProcessesStarted"]
    assert phases == [
        "FaultDetected",
        "DecisionMade",
        "CommunicationReady",
        "StateLoaded",
        "FirstStepCommitted",
        "RecoveryCompleted",
    ], kinds
    assert kinds.index("ProcessesStarted") < kinds.index("CommunicationReady"), kinds
    loaded = of_kind(incident, "StateLoaded")[0]
    assert (loaded["generation"], loaded["step"], loaded["source"]) == (1, 20, "checkpoint")
    first = of_kind(incident, "FirstStepCommitted")[0]
    assert (first["generation"], first["step"]) == (1, 21), first
    assert incident[-1]["strategy"] == "process-restart", incident[-1]
    assert recomputed_steps(run_dir) == 25 - 20


def test_lost_node_moves_its_pod_to_the_spare_node(run_dir: Path, fault_free: Reference) -> None:
    res = run_job(run_dir, "--chaos", FIXTURES / "kill-node.yaml")
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, run_dir, fault_free)

    evs = events(run_dir)
    incident = the_incident(evs)
    fault = incident[0]
    assert fault["source"] == "node-lost" and fault["nodes"] == ["node-1"], fault
    assert fault["pods"] == [WORKER] and fault["ranks"] == [2, 3], fault
    assert incident[1]["kind"] == "DecisionMade", incident[1]
    assert incident[1]["strategy"] == "pod-rescheduling", incident[1]
    assert of_kind(incident, "NodeIsolated", node="node-1"), incident
    # Only the pod of the lost node moves, to the spare node; rank 0's pod stays where it is.
    assert [(e["pod"], e["node"]) for e in of_kind(evs, "PodPlaced", generation=1)] == [
        (WORKER, "node-2")
    ]
    assert of_kind(evs, "ProcessesStarted", pod=MASTER, node="node-0", generation=1)
    assert of_kind(evs, "ProcessesStarted", pod=WORKER, node="node-2", generation=1)
    st = status(run_dir)
    assert st is not None
    assert {p["name"]: p["node"] for p in st["pods"]} == {MASTER: "node-0", WORKER: "node-2"}


def test_hung_rank_is_detected_as_a_hang_and_recovered(
    run_dir: Path, fault_free: Reference
) -> None:
    res = run_job(run_dir, "--chaos", FIXTURES / "hang-rank.yaml")
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, run_dir, fault_free)

    incident = the_incident(events(run_dir))
    fault = incident[0]
    assert fault["source"] == "hang" and fault["code"] == "heartbeat-timeout", fault
    assert fault["ranks"] == [2] and fault["pods"] == [WORKER], fault
    assert re.search(r"rank 2 \(pid \d+\) silent for [\d.]+ s", fault["detail"]), fault
    assert incident[1]["strategy"] == "process-restart", incident[1]
    loaded = of_kind(incident, "StateLoaded")[0]
    assert (loaded["step"], loaded["source"]) == (20, "checkpoint"), loaded


def test_isolating_device_fault_moves_the_pod_to_the_spare_node(
    run_dir: Path, fault_free: Reference, tmp_path: Path
) -> None:
    res = run_job(
        run_dir,
        "--cluster",
        FIXTURES / "cluster-fast-watch.yaml",
        "--chaos",
        FIXTURES / "device-isolate.yaml",
        job=polled_job(tmp_path),
    )
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, run_dir, fault_free)

    evs = events(run_dir)
    incident = the_incident(evs)
    fault = incident[0]
    assert (fault["source"], fault["code"], fault["level"]) == (
        "device",
        "80E3A201",
        "SeparateNPU",
    ), fault
    assert fault["nodes"] == ["node-1"] and fault["ranks"] == [3], fault
    assert incident[1]["strategy"] == "pod-rescheduling", incident[1]
    isolated = of_kind(incident, "DeviceIsolated")
    assert [(e["node"], e["device"], e["code"]) for e in isolated] == [("node-1", 1, "80E3A201")]
    assert not of_kind(evs, "NodeIsolated"), "a device fault isolated a whole node"
    assert [(e["pod"], e["node"]) for e in of_kind(evs, "PodPlaced", generation=1)] == [
        (WORKER, "node-2")
    ]
    assert of_kind(incident, "PodsStopped", pods=[WORKER]), incident


def test_a_device_fault_where_no_rank_runs_isolates_it_and_training_goes_on(
    run_dir: Path, fault_free: Reference, tmp_path: Path
) -> None:
    """A device of the spare node fails: no rank of the job is on it, so nothing stops; the
    device leaves the pool so that no pod is placed on it."""
    res = run_job(
        run_dir,
        "--cluster",
        FIXTURES / "cluster-fast-watch.yaml",
        "--chaos",
        FIXTURES / "device-idle.yaml",
        job=polled_job(tmp_path),
    )
    assert res.rc == 0, res.explain()
    assert "step 60/60; 0 fault(s), 0 recovery(ies)" in res.stdout, res.explain()
    assert digest(run_dir) == fault_free.digest
    evs = events(run_dir)
    assert [(e["node"], e["device"], e["level"]) for e in of_kind(evs, "IdleDeviceFault")] == [
        ("node-2", 0, "SeparateNPU")
    ]
    assert [(e["node"], e["device"]) for e in of_kind(evs, "DeviceIsolated")] == [("node-2", 0)]
    assert not of_kind(evs, "FaultDetected") and not of_kind(evs, "DecisionMade")


def test_exception_in_a_rank_is_reported_with_its_text_and_recovered(
    run_dir: Path, fault_free: Reference
) -> None:
    res = run_job(run_dir, "--chaos", FIXTURES / "exception-rank.yaml")
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, run_dir, fault_free)

    incident = the_incident(events(run_dir))
    fault = incident[0]
    assert fault["source"] == "exception" and fault["ranks"] == [1], fault
    assert "InjectedFault: injected exception in rank 1 before step 25" in fault["detail"], fault
    assert incident[1]["strategy"] == "process-restart", incident[1]
    assert of_kind(incident, "StateLoaded", generation=1, step=20), incident
    # The summary names the fault the way the ledger does.
    assert "exception fault InjectedFault (f1)" in res.stdout, res.stdout


def test_fault_scheduling_force_deletes_the_faulty_pod_at_once(
    run_dir: Path, fault_free: Reference, tmp_path: Path
) -> None:
    """``fault-scheduling: force``: the pod of an isolating device fault is deleted without a
    grace period (its processes are killed, not asked to stop) and placed on the spare node."""
    job = write_job(
        tmp_path / "job.yaml",
        replace={
            STEP_SLEEP: SLOW_STEP_SLEEP,
            'fault-scheduling: "grace"': 'fault-scheduling: "force"',
        },
    )
    res = run_job(
        run_dir,
        "--cluster",
        FIXTURES / "cluster-fast-watch.yaml",
        "--chaos",
        FIXTURES / "device-isolate.yaml",
        job=job,
    )
    assert res.rc == 0, res.explain()
    assert_succeeded(res.stdout, run_dir, fault_free)
    incident = the_incident(events(run_dir))
    assert incident[1]["strategy"] == "pod-rescheduling", incident[1]
    assert "grace_s=None" in str(incident[1]["commands"]), incident[1]
    (stopped,) = of_kind(incident, "PodsStopped")
    assert stopped["pods"] == [WORKER] and not stopped["graceful"], stopped
    assert [(e["pod"], e["node"]) for e in of_kind(incident, "PodPlaced", generation=1)] == [
        (WORKER, "node-2")
    ]
