"""Sharded training state (ZeRO over DDP, FSDP2, HSDP) through the session: every rank writes
its own shard of one checkpoint, a resumed run ends bitwise equal to a run that never stopped,
a checkpoint written by 4 ranks resumes on 2 with the same state, and the session refuses the
in-process rungs up front where no replica of a shard exists."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.worker_ranks import REPO, Cluster, read_result
from torch.distributed.checkpoint.filesystem import FileSystemReader

from unbroken.checkpoint import step_dir
from unbroken.protocol.mailbox import MAILBOX
from unbroken.worker.replica import RankState, ReplicaError, plan_repair
from unbroken.worker.sharding import Layout, Sharding, in_process_refusal

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(600)]

SCRIPT = REPO / "examples" / "train_sharded.py"
STEPS = 16


def _run(root: Path, world: int, args: list[str], *, managed: bool = False) -> dict[str, object]:
    cluster = Cluster(root, world_size=world, script=SCRIPT)
    try:
        cluster.start([*args, "--result", "result.json"], managed=managed).expect_success()
        return read_result(root / "result.json")
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Final digests of uninterrupted 2-rank runs of ``STEPS`` steps, by layout."""
    out = {}
    for parallel in ("zero", "fsdp"):
        root = tmp_path_factory.mktemp(f"reference-{parallel}")
        result = _run(root, 2, ["--parallel", parallel, "--steps", str(STEPS)])
        assert (result["steps"], result["start_step"]) == (STEPS, 0)
        out[parallel] = str(result["digest"])
    assert out["zero"] != out["fsdp"]  # the digests say something about the state
    yield out


def _files_with(path: Path, prefix: str) -> set[str]:
    """The files of checkpoint ``path`` that hold entries whose key starts with ``prefix``."""
    metadata = FileSystemReader(path).read_metadata()
    assert metadata.storage_data is not None
    return {
        info.relative_path
        for index, info in metadata.storage_data.items()
        if index.fqn.startswith(prefix)
    }


@pytest.mark.parametrize(
    ("parallel", "extra"), [("zero", []), ("fsdp", []), ("zero", ["--replica-optimizer"])]
)
def test_sharded_run_resumes_bitwise_from_its_checkpoint(
    tmp_path: Path, references: dict[str, str], parallel: str, extra: list[str]
) -> None:
    """With a replica optimizer the resumed ranks fill their replicas from their partners
    (the checkpoint holds each partition once) and check them; training is the same."""
    common = ["--parallel", parallel, "--ckpt-dir", "ckpt", "--ckpt-every", "5", *extra]
    first = _run(tmp_path, 2, [*common, "--steps", "12"])
    assert first["steps"] == 12
    ckpt = step_dir(tmp_path / "ckpt", 10)
    # Each rank wrote the optimizer state of its own shard: both files hold some of it.
    assert _files_with(ckpt, "optim.state.") == {"__0_0.distcp", "__1_0.distcp"}

    second = _run(tmp_path, 2, [*common, "--steps", str(STEPS)])
    assert (second["steps"], second["start_step"]) == (STEPS, 10)
    assert second["digest"] == references[parallel]


def test_hsdp_checkpoint_of_4_ranks_resumes_on_2(tmp_path: Path) -> None:
    at_10 = _run(tmp_path / "reference", 4, ["--parallel", "hsdp", "--steps", "10"])
    common = ["--ckpt-dir", "ckpt", "--ckpt-every", "10"]
    _run(tmp_path, 4, ["--parallel", "hsdp", *common, "--steps", "12"])
    # The 2-rank run shards the state over both ranks (one replica group).
    resumed = _run(
        tmp_path,
        2,
        ["--parallel", "hsdp", "--replicas", "1", *common, "--steps", "14", "--start-digest"],
    )
    assert (resumed["world_size"], resumed["start_step"], resumed["steps"]) == (2, 10, 14)
    assert resumed["start_digest"] == at_10["digest"]
    assert resumed["digest"] != at_10["digest"]  # and it trained on from there


def test_unreplicated_shards_turn_in_process_recovery_off_up_front(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, world_size=2, script=SCRIPT)
    try:
        gen = cluster.start(
            ["--parallel", "fsdp", "--steps", "3"],
            extra_env={MAILBOX: str(tmp_path / "mailbox-unused")},
        )
        gen.expect_success()
        for rank in range(2):
            record = gen.heartbeat(rank)
            assert record is not None and record.committed == 3
            assert record.recoverable == 0
            assert (
                "in-process recovery is off: fsdp: model, optimizer in 2 shard(s), 1 copy of "
                "each: a lost rank's shard has no replica on another rank, so only the newest "
                "checkpoint can restore it; the job restarts from it"
            ) in gen.log(rank)
    finally:
        cluster.close()


def test_layouts_say_which_ranks_hold_a_shard_and_what_replicas_cost() -> None:
    both = frozenset({"model", "optimizer"})
    hsdp = Sharding(Layout.HSDP, (0, 1, 0, 1), both)
    assert (hsdp.shards, hsdp.copies, hsdp.holders(3), hsdp.unreplicated) == (2, 2, (1, 3), False)
    # fp32 Adam: parameter, gradient and two moments, each 16/S bytes with S ranks per copy;
    # a second copy over the same 4 ranks costs 16/4 more (MindSpeed's replica optimizer
    # costs 16/d more than its distributed optimizer's 4 + 16/d).
    assert (hsdp.bytes_per_param(), hsdp.bytes_per_param(copies=1)) == (8.0, 4.0)
    assert hsdp.replica_bytes_per_param == 4.0
    # HSDP with 2 replica groups: a lost rank's shards have a replica, the rungs run in process.
    assert in_process_refusal(hsdp) is None
    hsdp_one_group = Sharding(Layout.HSDP, (0, 1, 2, 3), both)
    refusal = in_process_refusal(hsdp_one_group)
    assert refusal is not None and "has no replica on another rank" in refusal

    fsdp = Sharding(Layout.FSDP, (0, 1, 2, 3), both)
    assert (fsdp.copies, fsdp.holders(2), fsdp.unreplicated) == (1, (2,), True)
    assert fsdp.replica_bytes_per_param == 0.0
    refusal = in_process_refusal(fsdp)
    assert refusal is not None and "has no replica on another rank" in refusal

    # ZeRO-1 shards only the moments: 8 bytes replicated, 8/S sharded.
    zero = Sharding(Layout.ZERO, (0, 1, 0, 1), frozenset({"optimizer"}))
    assert (zero.bytes_per_param(), zero.replica_bytes_per_param) == (12.0, 2.0)
    assert "12 bytes of fp32 Adam state per parameter per rank, 2 more" in zero.describe()
    refusal = in_process_refusal(zero)
    assert refusal is not None and "does not regroup a ZeroRedundancyOptimizer" in refusal

    ddp = Sharding(Layout.REPLICATED, (0, 0, 0, 0), frozenset())
    assert (ddp.holders(1), ddp.unreplicated, in_process_refusal(ddp)) == (
        (0, 1, 2, 3),
        False,
        None,
    )


def test_replicas_of_a_shard_are_compared_and_a_difference_is_caught(tmp_path: Path) -> None:
    """HSDP 2 x 2: ranks 1 and 3 hold the same shard. Rank 3 changes its copy; the agreement
    check names rank 3 and the model, on every rank, and compares no rank with a rank that
    holds another shard (a fault-free run passes the same checks)."""
    script = REPO / "tests" / "multiproc" / "sharded_diverge_rank.py"
    for perturb, out in ((-1, tmp_path / "clean"), (3, tmp_path / "perturbed")):
        out.mkdir()
        cluster = Cluster(out, world_size=4, script=script)
        try:
            cluster.start(["--out", str(out), "--perturb", str(perturb)]).expect_success()
        finally:
            cluster.close()
        texts = [(out / f"rank{r}.txt").read_text() for r in range(4)]
        if perturb < 0:
            assert texts == ["finished\n"] * 4
            continue
        for text in texts:
            assert text.startswith("diverged\nreplicas diverged at step 4: rank(s) 3 differ "), text
            assert "from rank 1 in model;" in text
            assert text.endswith("[3] ['model']\n")


def test_hsdp_rank_that_lost_its_state_is_repaired_from_the_other_replica_group(
    tmp_path: Path,
) -> None:
    """HSDP 2 x 2: at step 3 every rank moves its FSDP modules to a new mesh's process groups
    (``rebind``) and destroys the old ones, and rank 3 loses its model and optimizer shards (a
    replacement's new model and empty optimizer). Source rank 0 does not hold rank 3's shard;
    the repair takes it from rank 1, which does, and the run ends bitwise equal to one without
    the loss (which keeps its groups)."""
    script = REPO / "tests" / "multiproc" / "sharded_repair_rank.py"
    results = []
    for lose, out in ((-1, tmp_path / "clean"), (3, tmp_path / "repaired")):
        out.mkdir()
        cluster = Cluster(out, world_size=4, script=script)
        try:
            rebind = ["--rebind"] if lose >= 0 else []
            cluster.start(
                ["--out", str(out), "--lose", str(lose), *rebind], managed=False
            ).expect_success()
        finally:
            cluster.close()
        results.append((out / "result.txt").read_text().splitlines())
        logs = "".join(p.read_text() for p in out.rglob("*.log"))
        if lose >= 0:
            assert "repairing rank(s) 3 from rank 1 at step 3" in logs, logs[-3000:]
    assert results[0][0] == "[]"
    assert results[1][0] == "[3]"
    assert results[1][1] == results[0][1]


def test_each_shard_is_sent_by_a_healthy_holder_or_the_repair_is_refused() -> None:
    hsdp = Sharding(Layout.HSDP, (0, 1, 0, 1), frozenset({"model", "optimizer"}))

    def states(fresh: set[int], *, stale: set[int] = frozenset()) -> list[RankState]:
        return [
            RankState(
                r,
                0 if r in fresh else 9 if r in stale else 10,
                2 if r in fresh else 0,
                bytes([hsdp.shard_of[r]]) * 32,
            )
            for r in range(4)
        ]

    # Rank 3 is a replacement: the command's source (0) sends nothing to it, rank 1 holds its
    # shard and sends it; rank 2, equal to its source, receives nothing.
    assert plan_repair(states({3}), hsdp, source=0, step=10) == {(0, 2): (0, ()), (1, 3): (1, (3,))}
    # A stale holder of the source's own shard receives from the source.
    assert plan_repair(states({3}, stale={2}), hsdp, source=0, step=10)[(0, 2)] == (0, (2,))
    # Both holders of shard 1 lost: no replica of it exists.
    with pytest.raises(ReplicaError, match=r"rank 1 cannot be the replica source .* replacement"):
        plan_repair(states({1, 3}), hsdp, source=0, step=10)
