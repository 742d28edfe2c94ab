"""``unbroken run`` with ``elastic-training``: 2 pods x 2 ranks of examples/train_elastic.py (4
virtual data-parallel ranks) on a cluster with no spare node. The worker pod's node is lost:
the master pod's ranks scale in to a world of 2 in their processes and train on, hosting all
four virtual ranks; the node comes back: the job scales out at a step boundary, the new pod's
ranks repaired from a replica. The model ends bit for bit as in the fault-free run."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import FIXTURES, digest, events, of_kind, run_job, status
from process_helpers import rank_pids, split_at_fault

pytestmark = pytest.mark.e2e

ELASTIC = FIXTURES / "elastic.yaml"
NO_SPARE = FIXTURES / "process-cluster-no-spare.yaml"
MASTER, WORKER = "e2e-elastic-master-0", "e2e-elastic-worker-0"


def test_lost_node_scales_in_and_its_return_scales_out_to_the_fault_free_model(
    run_dir: Path, tmp_path: Path
) -> None:
    reference = tmp_path / "fault-free"
    ref = run_job(reference, "--cluster", NO_SPARE, job=ELASTIC)
    assert ref.rc == 0 and "0 fault(s)" in ref.stdout, ref.explain()

    chaos = FIXTURES / "elastic-node-lost-and-back.yaml"
    res = run_job(run_dir, "--cluster", NO_SPARE, "--chaos", chaos, job=ELASTIC)
    assert res.rc == 0, res.explain()
    assert "job e2e-elastic: SUCCEEDED" in res.stdout, res.explain()
    assert "step 60/60; 1 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    assert digest(run_dir) == digest(reference), "the elastic run's model differs"

    evs = events(run_dir)
    fault = of_kind(evs, "FaultDetected")[0]
    assert fault["source"] == "node-lost" and fault["pods"] == [WORKER], fault
    decision = of_kind(evs, "DecisionMade")[0]
    assert decision["strategy"] == "elastic-training", decision
    assert decision["commands"] == [
        "IsolateNode(node='node-1')",
        f"ScaleIn(pod='{WORKER}', ranks=(2, 3), wait_s=0.0)",
    ], decision

    (scaled_in,) = of_kind(evs, "ScaledIn")
    assert (scaled_in["from_world_size"], scaled_in["world_size"]) == (4, 2), scaled_in
    assert scaled_in["pods"] == [WORKER] and scaled_in["fault_id"] == fault["fault_id"]
    assert 0 < scaled_in["took_s"] < 10, scaled_in
    assert of_kind(evs, "CommunicationReady", generation=1, world_size=2), evs
    (scaled_out,) = of_kind(evs, "ScaledOut")
    assert (scaled_out["from_world_size"], scaled_out["world_size"]) == (2, 4), scaled_out
    assert scaled_out["generation"] == 2 and scaled_out["step"] > scaled_in["step"]
    assert 0 < scaled_out["took_s"] < 20, scaled_out
    assert of_kind(evs, "NodeReturned", node="node-1"), evs
    # The shrunk world trained some steps on its own before it grew back.
    assert scaled_out["step"] - scaled_in["step"] >= 2, (scaled_in, scaled_out)
    assert [(e["pod"], e["node"]) for e in of_kind(evs, "PodPlaced", generation=2)] == [
        (WORKER, "node-1")
    ]

    # The master pod's ranks never restarted; the worker's came back as new processes.
    before, after = split_at_fault(evs)
    old, final = rank_pids(before), rank_pids(evs)
    assert {r: final[r] for r in (0, 1)} == {r: old[r] for r in (0, 1)}
    assert all(final[r] != old[r] for r in (2, 3)), (old, final)
    assert sorted(r for e in of_kind(after, "ProcessesStarted") for r in e["ranks"]) == [2, 3]
    st = status(run_dir)
    assert st is not None and st["phase"] == "Succeeded" and st["step"] == 60, st
