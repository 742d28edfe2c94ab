"""Virtual data-parallel ranks (examples/train_elastic.py, ranks started as torchrun starts
them): the model after N steps is bitwise the same on 2 processes hosting 4 virtual ranks as
after a run that went from 2 processes to 1 and back between steps (through checkpoints)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.worker_ranks import REPO, Cluster, read_result

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

ELASTIC = REPO / "examples" / "train_elastic.py"


def _run(root: Path, nproc: int, *args: str) -> dict[str, object]:
    cluster = Cluster(root, world_size=nproc, script=ELASTIC)
    try:
        cluster.start(
            ["--virtual-ranks", "4", "--ckpt-dir", "ckpt", "--result", "result.json", *args],
            managed=False,
        ).expect_success()
    finally:
        cluster.close()
    return read_result(root / "result.json")


def test_the_sum_over_virtual_ranks_does_not_depend_on_the_world_size(tmp_path: Path) -> None:
    fixed, changed = tmp_path / "fixed", tmp_path / "changed"
    two = _run(fixed, 2, "--steps", "8")
    assert (two["world_size"], two["steps"]) == (2, 8), two

    # 2 processes to step 4 (saved at 2 and 4), one process on from step 4 to 6, then 2 again.
    first = _run(changed, 2, "--steps", "5", "--ckpt-every", "2")
    assert first["digest"] != two["digest"]
    middle = _run(changed, 1, "--steps", "7", "--ckpt-every", "2")
    assert (middle["start_step"], middle["world_size"]) == (4, 1), middle
    last = _run(changed, 2, "--steps", "8", "--ckpt-every", "2")
    assert (last["start_step"], last["world_size"], last["steps"]) == (6, 2, 8), last
    assert last["digest"] == two["digest"]
