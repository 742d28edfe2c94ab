"""Real signals against real ranks: heartbeats under SIGSTOP, and stopping on SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.ranks import wait_for
from tests.support.worker_ranks import Cluster, Generation, is_stopped

from unbroken.worker import STOP_EXIT_CODE, HeartbeatRecord, Phase

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(600)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


def _record(generation: Generation, rank: int) -> HeartbeatRecord:
    record = generation.heartbeat(rank)
    assert record is not None, f"rank {rank} has no heartbeat file"
    return record


def _training(generation: Generation, min_committed: int = 3) -> bool:
    records = [generation.heartbeat(rank) for rank in range(2)]
    return all(r is not None and r.committed >= min_committed for r in records)


def test_a_stopped_rank_stops_ticking_while_a_blocked_peer_keeps_ticking(
    cluster: Cluster,
) -> None:
    ranks = cluster.start(["--steps", "100000", "--step-sleep", "0.01"])
    wait_for(lambda: _training(ranks), "both ranks to commit 3 steps")

    ranks.signal(1, signal.SIGSTOP)
    wait_for(lambda: is_stopped(ranks.pids[1]), "rank 1 to be stopped")
    frozen = _record(ranks, 1)
    peer = _record(ranks, 0)
    # Rank 0 soon blocks in an allreduce waiting for rank 1; gloo releases the GIL, so its
    # heartbeat thread keeps ticking while its step does not advance.
    wait_for(lambda: _record(ranks, 0).tick >= peer.tick + 10, "rank 0 to tick 10 more times")
    assert _record(ranks, 1) == frozen
    blocked = _record(ranks, 0)
    assert blocked.committed <= peer.committed + 1
    assert blocked.phase is Phase.TRAINING

    ranks.signal(1, signal.SIGCONT)
    wait_for(lambda: _record(ranks, 1).tick > frozen.tick, "rank 1 to tick again")
    wait_for(lambda: _record(ranks, 0).committed > blocked.committed + 2, "rank 0 to train again")


def test_sigterm_stops_at_a_step_boundary(cluster: Cluster) -> None:
    ranks = cluster.start(
        ["--steps", "100000", "--step-sleep", "0.01", "--ckpt-dir", "ckpt", "--ckpt-every", "5"]
    )
    wait_for(lambda: _training(ranks, 7), "both ranks to commit 7 steps")
    for rank in range(2):
        ranks.signal(rank, signal.SIGTERM)
    assert ranks.wait() == [STOP_EXIT_CODE, STOP_EXIT_CODE]
    for rank in range(2):
        record = _record(ranks, rank)
        assert record.phase is Phase.STOPPING
        # Stopped between steps: the last step begun is the last one committed, or, for a
        # rank whose peer left first, a step that failed in its collective and was not applied.
        assert record.committed == record.step + 1 or (
            record.committed == record.step and "while stopping; not recovering" in ranks.log(rank)
        )
        assert "Traceback" not in ranks.log(rank)
        assert f"rank {rank} stopping on request after {record.committed} committed" in (
            ranks.log(rank)
        )


def test_sigterm_to_a_rank_blocked_in_a_collective_ends_it_by_the_deadline(
    cluster: Cluster,
) -> None:
    ranks = cluster.start(["--steps", "100000", "--step-sleep", "0.01"])
    wait_for(lambda: _training(ranks), "both ranks to commit 3 steps")
    ranks.signal(1, signal.SIGSTOP)
    wait_for(lambda: is_stopped(ranks.pids[1]), "rank 1 to be stopped")
    before = _record(ranks, 0)
    wait_for(lambda: _record(ranks, 0).tick >= before.tick + 5, "rank 0 to tick on")
    ranks.signal(0, signal.SIGTERM)
    # The heartbeat shows the stop at once, though the main thread is inside the allreduce.
    wait_for(lambda: _record(ranks, 0).phase is Phase.STOPPING, "rank 0 to record the stop")
    assert ranks.procs[0].wait(timeout=120) == STOP_EXIT_CODE
    assert "no step boundary reached within" in ranks.log(0)
    ranks.kill()


def test_an_exception_in_the_loop_marks_the_rank_failed(cluster: Cluster) -> None:
    chaos = '[{"index": 0, "kind": "exception", "rank": 1, "at_step": 4}]'
    ranks = cluster.start(
        ["--steps", "100000", "--step-sleep", "0.01"],
        extra_env={"UNBROKEN_CHAOS": chaos, "UNBROKEN_CHAOS_DIR": str(cluster.root / "chaos")},
    )
    assert ranks.procs[1].wait(timeout=180) == 1
    failed = _record(ranks, 1)
    assert (failed.phase, failed.committed) == (Phase.FAILED, 4)
    assert "InjectedFault: injected exception in rank 1 before step 4" in ranks.log(1)
    # The peer's allreduce fails when rank 1's connections close: it fails too, and says so.
    assert ranks.procs[0].wait(timeout=180) == 1
    assert _record(ranks, 0).phase is Phase.FAILED
