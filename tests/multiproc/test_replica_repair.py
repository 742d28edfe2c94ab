"""In-process repair from a replica (:mod:`unbroken.worker.replica`) on real gloo groups: who
receives, and that every rank ends with the source's state, checked by digest."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from tests.support.worker_ranks import REPO, Cluster

sys.path.insert(0, str(REPO / "bench"))
from model_size import REPAIR

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(180)]

SCRIPT = REPO / "tests" / "multiproc" / "replica_rank.py"


def run(out: Path, *args: str) -> tuple[dict[str, object], str]:
    cluster = Cluster(out, world_size=3, script=SCRIPT)
    try:
        cluster.start(["--out", str(out), *args], managed=False).expect_success()
    finally:
        cluster.close()
    logs = "".join(p.read_text() for p in out.rglob("*.log"))
    return json.loads((out / "result.json").read_text()), logs


def test_a_replacement_and_an_unflagged_diverged_rank_both_end_with_the_sources_state(
    tmp_path: Path,
) -> None:
    """Rank 1 is a replacement and receives at once; rank 2 kept its process and says nothing
    is wrong, but one weight differs: the check after the transfer finds it, and it takes the
    source's state in a second round. Every digest equals rank 0's at the end."""
    result, logs = run(tmp_path, "--fresh", "1", "--diverged", "2")
    assert result == {"receivers": [1, 2], "equal": [True, True, True], "step": 3}
    assert "repairing rank(s) 1 from rank 0 at step 3 (rank 1: 0 steps, replacement)" in logs
    assert "rank(s) 2 held state other than the replica source's at step 3" in logs, logs
    # The replacement holds nothing of the source's (another seed, no optimizer state): every
    # tensor goes. Rank 2 differs in one weight: that tensor alone goes in the second round.
    sent = re.findall(r"sent (\d+) of (\d+) tensors .*they held the other (\d+) already", logs)
    assert len(sent) == 2, logs
    (first, second) = sent
    assert first[0] == first[1] and first[2] == "0", first
    assert second[0] == "1" and int(second[2]) == int(second[1]) - 1, second
    # What the receiver says it took, in the form bench/model_size.py reads.
    (took,) = [line for line in logs.splitlines() if REPAIR.match(line)]
    assert " replica rank 1 took " in took and " of step 3 from rank 0: " in took


def test_the_model_size_benchmark_reads_the_repairs_log_line(tmp_path: Path) -> None:
    _, logs = run(tmp_path, "--fresh", "2")
    assert len([line for line in logs.splitlines() if REPAIR.match(line)]) == 1, logs


def test_ranks_equal_to_the_source_take_nothing(tmp_path: Path) -> None:
    result, logs = run(tmp_path)
    assert result == {"receivers": [], "equal": [True, True, True], "step": 3}
    assert "repairing" not in logs
