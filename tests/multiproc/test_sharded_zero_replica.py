"""The replica optimizer of ZeRO-1 over DDP (:mod:`unbroken.worker.zero`): every rank's replica
of its partner's partition is bitwise the partner's own state, step after step, with no extra
communication; a rank that lost its optimizer state takes its partition from the next rank's
replica and its replica from the previous rank's partition, and training ends bitwise equal to
a run without the loss. The transfer plan is table-tested."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.worker_ranks import REPO, Cluster

from unbroken.worker.sharding import Layout, Sharding, in_process_refusal
from unbroken.worker.zero import (
    ZeroReplicaError,
    holders_of,
    mismatches,
    plan_completion,
    plan_transfers,
    replica_stride,
)

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(600)]

SCRIPT = REPO / "tests" / "multiproc" / "sharded_zero_replica_rank.py"


def test_replica_is_bitwise_its_partners_partition_and_repairs_a_lost_rank(
    tmp_path: Path,
) -> None:
    results = []
    runs = (
        (["--lose", "-1"], tmp_path / "clean"),
        (["--lose", "2"], tmp_path / "repaired"),
        (["--lose", "2", "--half"], tmp_path / "completed"),
    )
    for args, out in runs:
        out.mkdir()
        cluster = Cluster(out, world_size=4, script=SCRIPT)
        try:
            cluster.start(["--out", str(out), *args], managed=False).expect_success()
        finally:
            cluster.close()
        results.append((out / "result.txt").read_text().splitlines())
    assert results[0][0] == "[0, 0, 0, 0]"
    # Rank 2 received twice; rank 3 sent its replica of partition 2, rank 1 its own partition.
    assert results[1][0] == "[0, 1, 2, 1]"
    assert results[1][1] == results[0][1]
    # Lost inside the update: the others' partitions and rank 3's replica of partition 2
    # complete it, then rank 2's partitions are repaired as above; the same model at the end.
    assert results[2][0] == "[0, 1, 2, 1]"
    assert results[2][1] == results[0][1]
    # Each replica holds a copy of its partner's parameters and their two moments: 12 bytes
    # per parameter of the partition (fp32 AdamW), each parameter in one partition.
    replica_bytes, covered = map(int, results[0][2].split())
    assert covered == (32 * 64 + 64) + (64 * 64 + 64) + (64 * 8 + 8)  # train_sharded's MLP
    assert replica_bytes == 12 * covered


@pytest.mark.parametrize(
    ("updated", "size", "stride", "expected"),
    [
        ([0, 1, 3], 4, 1, [(0, 0, "own"), (1, 1, "own"), (2, 3, "replica"), (3, 3, "own")]),
        ([0, 1], 4, 2, [(0, 0, "own"), (1, 1, "own"), (2, 0, "replica"), (3, 1, "replica")]),
        ([0, 1, 2, 3], 4, 2, [(0, 0, "own"), (1, 1, "own"), (2, 2, "own"), (3, 3, "own")]),
    ],
)
def test_completion_plan_takes_each_partition_from_an_updated_holder(
    updated: list[int], size: int, stride: int, expected: list[tuple[int, int, str]]
) -> None:
    assert plan_completion(updated, size, stride) == expected


def test_a_partition_no_updated_rank_holds_cannot_be_completed() -> None:
    # Node 0 (ranks 0, 1) took the update, rank 1 did not: partition 1 and its replica on
    # rank 3 (lost) have no updated copy.
    with pytest.raises(ZeroReplicaError, match="partition 1 is held by no rank"):
        plan_completion([0], 4, 2)


@pytest.mark.parametrize(
    ("lost", "size", "expected"),
    [
        ([2], 4, [(3, 2, "own"), (1, 2, "replica")]),
        ([0], 4, [(1, 0, "own"), (3, 0, "replica")]),
        ([3], 4, [(0, 3, "own"), (2, 3, "replica")]),
        ([0, 2], 4, [(1, 0, "own"), (3, 0, "replica"), (3, 2, "own"), (1, 2, "replica")]),
        ([1], 2, [(0, 1, "own"), (0, 1, "replica")]),
        ([], 4, []),
    ],
)
def test_each_lost_partition_comes_from_its_other_holder(
    lost: list[int], size: int, expected: list[tuple[int, int, str]]
) -> None:
    assert plan_transfers(lost, size) == expected


@pytest.mark.parametrize(
    ("lost", "size", "message"),
    [
        ([1, 2], 4, r"partition 1 is lost with both its holders \(ranks 1 and 2\)"),
        ([3, 0], 4, r"partition 3 is lost with both its holders \(ranks 3 and 0\)"),
        ([0], 1, "a ZeRO group of 1 rank keeps no replica"),
        ([4], 4, r"rank\(s\) \[4\] are not in a ZeRO group of 4"),
    ],
)
def test_a_partition_without_a_holder_left_is_refused(
    lost: list[int], size: int, message: str
) -> None:
    with pytest.raises(ZeroReplicaError, match=message):
        plan_transfers(lost, size)


def test_across_nodes_the_replica_is_a_node_away_so_a_lost_node_loses_no_partition() -> None:
    # 2 nodes x 2 ranks: partition p is held by p and p + 2, on the other node.
    assert replica_stride(4, 2) == 2 and replica_stride(4, 4) == 1 and replica_stride(2, 2) == 1
    assert [holders_of(p, 4, 2) for p in range(4)] == [(0, 2), (1, 3), (2, 0), (3, 1)]
    assert plan_transfers([2, 3], 4, 2) == [
        (0, 2, "own"),
        (0, 2, "replica"),
        (1, 3, "own"),
        (1, 3, "replica"),
    ]
    with pytest.raises(ZeroReplicaError, match=r"partition 1 is lost with both its holders"):
        plan_transfers([1, 3], 4, 2)
    with pytest.raises(ZeroReplicaError, match=r"partition 2 is lost with both its holders"):
        plan_transfers([2, 3], 4, 1)  # the neighbour on the same node holds the replica
    a, b, c, d = (x * 32 for x in (b"a", b"b", b"c", b"d"))
    assert mismatches([(a, c), (b, d), (c, a), (d, b)], 2) == []
    assert mismatches([(a, c), (b, d), (c, a), (d, a)], 2) == [3]


def test_a_replica_that_differs_from_its_partner_is_named() -> None:
    a, b, c = b"a" * 32, b"b" * 32, b"c" * 32
    # (own, replica) per rank: rank r's replica must equal rank r-1's own.
    assert mismatches([(a, c), (b, a), (c, b)]) == []
    assert mismatches([(a, c), (b, b), (c, b)]) == [1]


@pytest.mark.parametrize(
    ("partner_replicas", "world", "refused"),
    [(True, 4, False), (True, 2, False), (False, 4, True), (False, 2, True)],
)
def test_zero_takes_the_in_process_rungs_only_with_its_replicas(
    partner_replicas: bool, world: int, refused: bool
) -> None:
    zero = Sharding(Layout.ZERO, tuple(range(world)), frozenset({"optimizer"}), partner_replicas)
    assert zero.unreplicated is refused
    reason = in_process_refusal(zero)
    assert (reason is not None) is refused, reason
    if refused:
        assert reason is not None and "a lost rank's shard has no replica" in reason
    else:
        assert "each also held by the next rank" in zero.describe()
