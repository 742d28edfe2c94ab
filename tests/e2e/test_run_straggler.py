"""``unbroken run`` with a straggler: 2 pods x 2 ranks of examples/train_mlp.py (DDP) with
``subHealthyStrategy: hotSwitch`` and a spare node. node-1 is held to 5% of one CPU (a cgroup
quota, the chaos file's ``throttle``) from step 10: its ranks' compute times fall behind their
peers', the node is a straggler (a sub-health fault), and its pod is hot-switched to the spare
node with no step recomputed, the healthy ranks keeping their processes. The model ends bit for
bit as in the fault-free run."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.cli_runs import FIXTURES, digest, events, of_kind, run_job
from tests.support.process_helpers import rank_pids, recomputed_steps

from unbroken.chaos.throttle import CPU_ROOT, unavailable

pytestmark = pytest.mark.e2e

STRAGGLER = FIXTURES / "straggler.yaml"
CLUSTER = FIXTURES / "cluster-fast-watch.yaml"  # 3 nodes: one spare
WORKER = "e2e-straggler-worker-0"


@pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")
def test_a_throttled_node_is_a_straggler_and_its_pod_is_hot_switched(
    run_dir: Path, tmp_path: Path
) -> None:
    reference = tmp_path / "fault-free"
    ref = run_job(reference, "--cluster", CLUSTER, job=STRAGGLER)
    assert ref.rc == 0 and "0 fault(s)" in ref.stdout, ref.explain()

    chaos = FIXTURES / "throttle-node.yaml"
    res = run_job(run_dir, "--cluster", CLUSTER, "--chaos", chaos, job=STRAGGLER)
    assert res.rc == 0, res.explain()
    assert "job e2e-straggler: SUCCEEDED" in res.stdout, res.explain()
    assert "step 80/80; 1 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    assert digest(run_dir) == digest(reference), "the switched run's model differs"
    assert not list(CPU_ROOT.glob("unbroken-*")), "the throttle cgroup outlived the run"

    evs = events(run_dir)
    (injected,) = of_kind(evs, "FaultInjected")
    assert injected["detail"].startswith("node node-1 throttled to 0.05 of one CPU"), injected
    (fault,) = of_kind(evs, "FaultDetected")
    assert (fault["source"], fault["code"], fault["level"]) == (
        "sub-health",
        "Straggler",
        "SubHealth",
    )
    assert (fault["nodes"], fault["pods"], fault["ranks"]) == (["node-1"], [WORKER], [2, 3])
    (switched,) = of_kind(evs, "PodHotSwitched")
    assert (switched["pod"], switched["from_node"], switched["to_node"]) == (
        WORKER,
        "node-1",
        "node-2",
    ), switched
    assert recomputed_steps(run_dir) == 0
    at = next(i for i, e in enumerate(evs) if e["id"] == fault["id"])
    old, final = rank_pids(evs[:at]), rank_pids(evs)
    assert (final[0], final[1]) == (old[0], old[1]), (old, final)
    assert final[2] != old[2] and final[3] != old[3], (old, final)
