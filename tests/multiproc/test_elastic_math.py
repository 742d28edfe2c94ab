"""Virtual data-parallel ranks (examples/train_elastic.py under plain torchrun): the model after
N steps is bitwise the same on 2 processes hosting 4 virtual ranks as after a run that went
from 2 processes to 1 and back between steps (through checkpoints)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from worker_ranks import REPO, clean_env, read_result

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

ELASTIC = REPO / "examples" / "train_elastic.py"


def _torchrun(cwd: Path, nproc: int, *args: str) -> dict[str, object]:
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run(
        [
            *(str(torchrun), "--standalone", "--nproc_per_node", str(nproc), str(ELASTIC)),
            *("--virtual-ranks", "4", "--ckpt-dir", "ckpt", "--result", "result.json", *args),
        ],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return read_result(cwd / "result.json")


def test_the_sum_over_virtual_ranks_does_not_depend_on_the_world_size(tmp_path: Path) -> None:
    fixed, changed = tmp_path / "fixed", tmp_path / "changed"
    fixed.mkdir()
    changed.mkdir()
    two = _torchrun(fixed, 2, "--steps", "8")
    assert (two["world_size"], two["steps"]) == (2, 8), two

    # 2 processes to step 4 (saved at 2 and 4), one process on from step 4 to 6, then 2 again.
    first = _torchrun(changed, 2, "--steps", "5", "--ckpt-every", "2")
    assert first["digest"] != two["digest"]
    middle = _torchrun(changed, 1, "--steps", "7", "--ckpt-every", "2")
    assert (middle["start_step"], middle["world_size"]) == (4, 1), middle
    last = _torchrun(changed, 2, "--steps", "8", "--ckpt-every", "2")
    assert (last["start_step"], last["world_size"], last["steps"]) == (6, 2, 8), last
    assert last["digest"] == two["digest"]
