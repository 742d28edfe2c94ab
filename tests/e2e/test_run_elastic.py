"""``unbroken run`` with ``elastic-training``: 2 pods x 2 ranks of examples/train_elastic.py (4
virtual data-parallel ranks) on a cluster with no spare node. The worker pod's node is lost:
the master pod's ranks scale in to a world of 2 in their processes and train on, hosting all
four virtual ranks; rank 1 dies while the job is scaled in and is recovered in place at that
size; the node comes back: the job scales out at a step boundary, the new pod's ranks repaired
from a replica. The model ends bit for bit as in the fault-free run."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    REPO,
    digest,
    events,
    of_kind,
    run_job,
    status,
    write_job,
)
from tests.support.process_helpers import rank_pids

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
    assert "step 80/80; 2 fault(s), 2 recovery(ies)" in res.stdout, res.explain()
    assert digest(run_dir) == digest(reference), "the elastic run's model differs"

    evs = events(run_dir)
    lost, killed = of_kind(evs, "FaultDetected")
    assert lost["source"] == "node-lost" and lost["pods"] == [WORKER], lost
    assert killed["source"] == "process-exit" and killed["ranks"] == [1], killed
    scale_in, in_place = of_kind(evs, "DecisionMade")
    assert scale_in["strategy"] == "elastic-training", scale_in
    assert scale_in["commands"] == [
        "IsolateNode(node='node-1')",
        f"ScaleIn(pod='{WORKER}', ranks=(2, 3), wait_s=0.0)",
    ], scale_in
    assert in_place["strategy"] == "recover-in-place", in_place

    (scaled_in,) = of_kind(evs, "ScaledIn")
    assert (scaled_in["from_world_size"], scaled_in["world_size"]) == (4, 2), scaled_in
    assert scaled_in["pods"] == [WORKER] and scaled_in["fault_id"] == lost["fault_id"]
    assert 0 < scaled_in["took_s"] < 10, scaled_in
    # Generation 1 is the scaled-in world; generation 2 its in-place recovery of rank 1.
    assert of_kind(evs, "CommunicationReady", generation=1, world_size=2), evs
    assert of_kind(evs, "CommunicationReady", generation=2, world_size=2), evs
    assert of_kind(evs, "ProcessesStarted", pod=MASTER, ranks=[1], generation=2), evs
    (scaled_out,) = of_kind(evs, "ScaledOut")
    assert (scaled_out["from_world_size"], scaled_out["world_size"]) == (2, 4), scaled_out
    assert scaled_out["generation"] == 3, scaled_out
    assert 0 < scaled_out["took_s"] < 20, scaled_out
    assert of_kind(evs, "CommunicationReady", generation=3, world_size=4), evs
    assert of_kind(evs, "NodeReturned", node="node-1"), evs
    # The scaled-in world trained steps of its own before it grew back.
    assert scaled_out["step"] - scaled_in["step"] >= 5, (scaled_in, scaled_out)
    assert [(e["pod"], e["node"]) for e in of_kind(evs, "PodPlaced", generation=3)] == [
        (WORKER, "node-1")
    ]

    # Rank 0 ran in one process from the start to the end; rank 1 was replaced once (it was
    # killed), ranks 2 and 3 came back as new processes on the returned node.
    first = of_kind(evs, "ProcessesStarted", generation=0)
    old = rank_pids(first)
    final = rank_pids(evs)
    assert final[0] == old[0], (old, final)
    assert all(final[r] != old[r] for r in (1, 2, 3)), (old, final)
    started = sorted(
        r for e in of_kind(evs, "ProcessesStarted") if e["generation"] > 0 for r in e["ranks"]
    )
    assert started == [1, 2, 3], of_kind(evs, "ProcessesStarted")
    st = status(run_dir)
    assert st is not None and st["phase"] == "Succeeded" and st["step"] == 80, st


def test_a_lost_pod_before_the_last_is_dropped_and_the_scale_in_recorded(
    run_dir: Path, tmp_path: Path
) -> None:
    """3 pods x 2 ranks (6 virtual ranks) on 3 nodes, no spare: the first Worker pod's node
    is lost. The ranks of the pod after it are numbered anew in the smaller world (job ranks
    4, 5 become ranks 2, 3 of 4), and the manager still reads them as ranks 4 and 5: the
    scale-in is recorded with its MTTR, the job trains to its end at 4 ranks and ends with
    the fault-free model."""
    job = write_job(
        tmp_path / "job.yaml",
        job=ELASTIC,
        replace={
            "../../../examples/train_elastic.py": str(REPO / "examples" / "train_elastic.py"),
            "--virtual-ranks=4": "--virtual-ranks=6",
            "    Worker:\n      replicas: 1\n      minReplicas: 0": (
                "    Worker:\n      replicas: 2\n      minReplicas: 1"
            ),
        },
    )
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes: 3\ndevicesPerNode: 2\n")
    reference = tmp_path / "fault-free"
    ref = run_job(reference, "--cluster", cluster, job=job)
    assert ref.rc == 0 and "step 80/80; 0 fault(s)" in ref.stdout, ref.explain()

    res = run_job(run_dir, "--cluster", cluster, "--chaos", FIXTURES / "kill-node.yaml", job=job)
    assert res.rc == 0, res.explain()
    assert "step 80/80; 1 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    assert digest(run_dir) == digest(reference), "the elastic run's model differs"
    evs = events(run_dir)
    (lost,) = of_kind(evs, "FaultDetected")
    assert lost["pods"] == ["e2e-elastic-worker-0"] and lost["ranks"] == [2, 3], lost
    (scaled_in,) = of_kind(evs, "ScaledIn")
    assert (scaled_in["from_world_size"], scaled_in["world_size"]) == (6, 4), scaled_in
    (done,) = of_kind(evs, "RecoveryCompleted")
    assert done["strategy"] == "elastic-training" and done["fault_id"] == lost["fault_id"], done
    st = status(run_dir)
    assert st is not None and st["phase"] == "Succeeded" and st["step"] == 80, st
