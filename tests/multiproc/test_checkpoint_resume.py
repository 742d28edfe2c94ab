"""Resuming from checkpoints: a killed run, and runs whose newest checkpoints are damaged,
end bitwise equal to a run that never stopped."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.ranks import wait_for
from tests.support.worker_ranks import Cluster, read_result

from unbroken.checkpoint import find_latest_good, step_dir, verify
from unbroken.worker import Phase

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(600)]

STEPS = 30


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


@pytest.fixture(scope="module")
def reference_digest(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The final model of an uninterrupted run without checkpoints."""
    cluster = Cluster(tmp_path_factory.mktemp("reference"))
    try:
        cluster.start(["--steps", str(STEPS), "--result", "result.json"], managed=False)
        cluster.generations[0].expect_success()
        result = read_result(cluster.root / "result.json")
    finally:
        cluster.close()
    assert (result["steps"], result["start_step"]) == (STEPS, 0)
    digest = result["digest"]
    assert isinstance(digest, str) and len(digest) == 64
    return digest


def test_killed_ranks_resume_from_the_last_checkpoint(
    cluster: Cluster, reference_digest: str
) -> None:
    args = ["--steps", str(STEPS), "--ckpt-dir", "ckpt", "--ckpt-every", "5"]
    first = cluster.start([*args, "--step-sleep", "0.03"])

    def past_second_checkpoint() -> bool:
        record = first.heartbeat(0)
        return record is not None and record.ckpt_step >= 10 and record.committed >= 12

    wait_for(past_second_checkpoint, "rank 0 to commit step 12 after checkpoint 10")
    for rank in range(2):
        first.signal(rank, signal.SIGKILL)
    assert first.wait() == [-signal.SIGKILL, -signal.SIGKILL]
    killed_at = first.heartbeat(0)
    assert killed_at is not None and killed_at.committed < STEPS

    second = cluster.start([*args, "--result", "result.json"])
    second.expect_success()
    result = read_result(cluster.root / "result.json")
    assert result["steps"] == STEPS
    assert 10 <= result["start_step"] <= killed_at.committed
    assert result["start_step"] % 5 == 0
    assert result["digest"] == reference_digest

    for rank in range(2):
        record = second.heartbeat(rank)
        assert record is not None
        assert record.phase is Phase.DONE
        assert (record.generation, record.rank) == (1, rank)
        assert (record.start_step, record.committed, record.step) == (
            result["start_step"],
            STEPS,
            STEPS - 1,
        )
        assert 0 < record.started_at <= record.comm_ready_at <= record.state_loaded_at
        assert record.state_loaded_at <= record.first_commit_at <= record.committed_at
        assert record.step_time_s > 0
    assert find_latest_good(cluster.root / "ckpt") == (25, step_dir(cluster.root / "ckpt", 25))


def test_damaged_checkpoints_are_skipped_for_the_previous_good_one(
    cluster: Cluster, reference_digest: str
) -> None:
    ckpt = cluster.root / "ckpt"
    common = ["--ckpt-dir", "ckpt", "--ckpt-every", "5"]
    cluster.start(["--steps", "20", *common], managed=False).expect_success()
    assert [verify(step_dir(ckpt, s)).step for s in (5, 10, 15)] == [5, 10, 15]

    truncated = step_dir(ckpt, 15)
    data = truncated / "__0_0.distcp"
    full_size = data.stat().st_size
    with data.open("r+b") as f:
        f.truncate(full_size // 2)
    unfinished = step_dir(ckpt, 10)
    (unfinished / "MANIFEST.json").unlink()

    second = cluster.start(["--steps", str(STEPS), *common, "--result", "result.json"])
    second.expect_success()
    result = read_result(cluster.root / "result.json")
    assert result["start_step"] == 5
    assert result["digest"] == reference_digest
    log = second.log(0)
    # The script was given the relative directory "ckpt"; messages name what it was given.
    truncated, unfinished = (
        truncated.relative_to(cluster.root),
        unfinished.relative_to(cluster.root),
    )
    assert (
        f"skipping checkpoint {truncated}: file __0_0.distcp is {full_size // 2} bytes, "
        f"the manifest says {full_size}"
    ) in log
    assert f"skipping checkpoint {unfinished}: no MANIFEST.json (the save did not finish)" in log
    assert f"moved unusable checkpoint {truncated} aside to step_00000015.invalid" in log
    # The resumed run wrote new, good checkpoints at the same steps.
    assert verify(step_dir(ckpt, 15)).step == 15
    assert find_latest_good(ckpt) == (25, step_dir(ckpt, 25))
