"""``unbroken run`` with ``subHealthyStrategy: hotSwitch``: 2 pods x 2 ranks of
examples/train_mlp.py on gloo, one spare node. A device of the worker pod turns sub-healthy:
training goes on while the backup pod is placed on the spare node; then every rank stops at a
step boundary, the old pod is deleted and the backup's ranks take their state from a healthy
replica. No step is trained twice, the healthy pod's processes never restart, and the final
model is the fault-free one, bit for bit. The rank-0 pod is not hot-switched (as in the
reference): there, training goes on on the sub-healthy device."""

from __future__ import annotations

from pathlib import Path

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
    replica_specs,
    run_job,
    status,
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

HOT_SWITCH = FIXTURES / "hot-switch.yaml"
MASTER, WORKER = "e2e-hotswitch-master-0", "e2e-hotswitch-worker-0"
RANKS = [0, 1, 2, 3]


def polled(tmp_path: Path) -> Path:
    """The hot-switch job with slower steps: a device fault at step 5 reaches the device
    plugin's next poll (every 3 s) while the job still trains."""
    assert replica_specs(HOT_SWITCH) == replica_specs(JOB), "another model than the e2e job's"
    return write_job(tmp_path / "job.yaml", job=HOT_SWITCH, replace={STEP_SLEEP: SLOW_STEP_SLEEP})


def run_with(run_dir: Path, tmp_path: Path, chaos: str) -> tuple[str, int]:
    res = run_job(
        run_dir,
        "--cluster",
        FIXTURES / "cluster-fast-watch.yaml",
        "--chaos",
        FIXTURES / chaos,
        job=polled(tmp_path),
    )
    return res.stdout + res.explain(), res.rc


def test_a_sub_healthy_pod_is_hot_switched_to_the_spare_node(
    run_dir: Path, fault_free: Reference, tmp_path: Path
) -> None:
    out, rc = run_with(run_dir, tmp_path, "device-subhealth.yaml")
    assert rc == 0, out
    assert "job e2e-hotswitch: SUCCEEDED" in out, out
    assert "step 60/60; 1 fault(s), 1 recovery(ies)" in out, out
    assert digest(run_dir) == fault_free.digest, "the switched model differs from the fault-free"

    evs = events(run_dir)
    incident = the_incident(evs)
    fault = incident[0]
    assert (fault["source"], fault["code"], fault["level"]) == (
        "sub-health",
        "80E20207",
        "SubHealth",
    )
    assert fault["pods"] == [WORKER] and fault["ranks"] == [3], fault
    decision = incident[1]
    assert decision["strategy"] == "hot-switch", decision
    assert decision["commands"] == [f"HotSwitch(pod='{WORKER}', node='node-1', device=1)"]
    # The old pod is deleted, its sub-healthy device leaves the pool, the backup runs on the
    # spare node in the warm spare agent that waited there.
    assert of_kind(incident, "PodsStopped", pods=[WORKER]), incident
    isolated = of_kind(incident, "DeviceIsolated")
    assert [(e["node"], e["device"]) for e in isolated] == [("node-1", 1)], isolated
    assert [(e["pod"], e["node"]) for e in of_kind(evs, "PodPlaced", generation=1)] == [
        (WORKER, "node-2")
    ]
    assert of_kind(incident, "SpareTaken", node="node-2", pod=WORKER), incident
    loaded = of_kind(incident, "StateLoaded")[0]
    assert (loaded["generation"], loaded["source"]) == (1, "replica"), loaded
    assert loaded["step"] >= fault["step"], (loaded, fault)
    first = of_kind(incident, "FirstStepCommitted")[0]
    assert (first["generation"], first["step"]) == (1, loaded["step"] + 1), first
    assert incident[-1]["strategy"] == "hot-switch", incident[-1]
    (switched,) = of_kind(evs, "PodHotSwitched")
    assert (switched["pod"], switched["from_node"], switched["to_node"]) == (
        WORKER,
        "node-1",
        "node-2",
    ), switched
    assert (switched["fault_id"], switched["generation"], switched["step"]) == (
        fault["fault_id"],
        1,
        first["step"],
    ), switched
    assert switched["switch_s"] > 0 and switched["prepare_s"] >= 0, switched
    assert recomputed_steps(run_dir) == 0

    # The master pod's processes never restart; the worker pod's ranks run on the spare node.
    before, after = split_at_fault(evs)
    assert started_ranks(before) == RANKS and started_ranks(after) == [2, 3], after
    old, final = rank_pids(before), rank_pids(evs)
    assert (final[0], final[1]) == (old[0], old[1]), (old, final)
    assert final[2] != old[2] and final[3] != old[3], (old, final)
    st = status(run_dir)
    assert st is not None and st["phase"] == "Succeeded" and status_rank_pids(st) == final
    assert {p["name"]: p["node"] for p in st["pods"]} == {MASTER: "node-0", WORKER: "node-2"}


def test_the_rank0_pod_is_not_hot_switched_and_training_goes_on(
    run_dir: Path, fault_free: Reference, tmp_path: Path
) -> None:
    out, rc = run_with(run_dir, tmp_path, "device-subhealth-master.yaml")
    assert rc == 0, out
    assert "step 60/60; 1 fault(s), 0 recovery(ies)" in out, out
    assert digest(run_dir) == fault_free.digest
    evs = events(run_dir)
    (fault,) = of_kind(evs, "FaultDetected")
    assert fault["level"] == "SubHealth" and fault["pods"] == [MASTER], fault
    (decision,) = of_kind(evs, "DecisionMade")
    assert (decision["strategy"], decision["commands"]) == ("none", []), decision
    why = "hot switch not possible (the rank-0 pod is not hot-switched); training goes on"
    assert why in decision["reason"], decision
    assert not of_kind(evs, "PodsStopped") and not of_kind(evs, "PodHotSwitched")
    # Nothing restarted: every rank trained in the process it started in.
    assert started_ranks(evs) == RANKS
    st = status(run_dir)
    assert st is not None and st["phase"] == "Succeeded", st
