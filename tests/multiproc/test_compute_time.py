"""The part of a step a rank computes alone (start -> gradient collective) reaches its heartbeat,
where the straggler scores (:mod:`unbroken.policy.straggler`) read it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.worker_ranks import REPO, Cluster

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

ELASTIC = REPO / "examples" / "train_elastic.py"
COMPUTE_S = 0.05  # examples/train_elastic.py's --step-sleep is before reduce_gradients


def test_each_rank_reports_its_compute_time(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, world_size=2, script=ELASTIC)
    try:
        run = cluster.start(
            ["--virtual-ranks", "2", "--steps", "4", "--step-sleep", str(COMPUTE_S)]
        )
        run.expect_success()
        for rank in range(2):
            record = run.heartbeat(rank)
            assert record is not None and record.committed == 4
            assert record.compute_time_s >= COMPUTE_S, record
    finally:
        cluster.close()
