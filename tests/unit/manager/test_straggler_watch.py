"""The manager's straggler watch: rank views in, one sub-health fault per slow node out."""

from __future__ import annotations

import pytest

from unbroken.faults import FaultKind, FaultLevel
from unbroken.manager.progress import RankView
from unbroken.manager.straggler import STRAGGLER_CODE, StragglerWatch
from unbroken.policy.straggler import StragglerKnobs

pytestmark = pytest.mark.unit

NODE_OF = {0: "n0", 1: "n1"}
POD_OF = {0: "worker-0", 1: "worker-1"}


def views(step: int, compute: dict[int, float]) -> dict[int, RankView]:
    return {
        r: RankView(rank=r, pid=100 + r, generation=0, committed=step, compute_time_s=t)
        for r, t in compute.items()
    }


def test_a_slow_node_is_one_sub_health_fault_and_a_moved_rank_starts_afresh() -> None:
    watch = StragglerWatch(StragglerKnobs(threshold=0.75, window=2, hold_s=3.0))
    now = 0.0
    faults = []
    for step in range(1, 9):
        now += 1.0
        faults += watch.poll(now, views(step, {0: 0.1, 1: 0.4}), NODE_OF, POD_OF)
    # Scored from step 2 (a full window) at t=2; slow for hold_s at t=5; reported once.
    assert len(faults) == 1
    f = faults[0]
    assert (f.kind, f.level) == (FaultKind.SUB_HEALTH, FaultLevel.SUB_HEALTH)
    assert f.code == STRAGGLER_CODE
    assert (f.node, f.pod, f.ranks, f.at) == ("n1", "worker-1", (1,), 2.0)
    assert "rank 1 0.25" in f.detail
    # Rank 1 moved to a spare node: its slow steps stay with the old node.
    moved = {0: "n0", 1: "spare"}
    now += 1.0
    assert watch.poll(now, views(9, {0: 0.1, 1: 0.1}), moved, POD_OF) == []
    assert watch.tracker.medians() == {0: pytest.approx(0.1)}
    for step in range(10, 20):
        now += 1.0
        assert watch.poll(now, views(step, {0: 0.1, 1: 0.1}), moved, POD_OF) == []


def test_dead_ranks_and_ranks_without_timing_are_not_scored() -> None:
    watch = StragglerWatch(StragglerKnobs(window=1, hold_s=0.0))
    ranks = views(3, {0: 0.1, 1: 0.0})  # rank 1 runs no gradient collective: no timing
    assert watch.poll(1.0, ranks, NODE_OF, POD_OF) == []
    ranks = views(4, {0: 0.1, 1: 0.5})
    ranks[1].alive = False
    assert watch.poll(2.0, ranks, NODE_OF, POD_OF) == []
