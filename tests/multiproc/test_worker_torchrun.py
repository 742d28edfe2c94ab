"""Under plain torchrun (no UNBROKEN_* variables) the hooks are no-ops and training,
checkpointing and resuming work as ever."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.ranks import clean_env
from tests.support.worker_ranks import EXAMPLE, read_result

from unbroken.checkpoint import find_latest_good, step_dir

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(600)]


def _torchrun(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    torchrun = Path(sys.executable).with_name("torchrun")
    return subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", "2", str(EXAMPLE), *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_example_trains_and_resumes_under_plain_torchrun(tmp_path: Path) -> None:
    common = ["--ckpt-dir", "ckpt", "--ckpt-every", "4", "--result", "result.json"]
    first = _torchrun(tmp_path, "--steps", "10", *common)
    assert first.returncode == 0, first.stderr[-3000:]
    assert find_latest_good(tmp_path / "ckpt") == (8, step_dir(tmp_path / "ckpt", 8))
    assert read_result(tmp_path / "result.json")["steps"] == 10

    second = _torchrun(tmp_path, "--steps", "14", *common)
    assert second.returncode == 0, second.stderr[-3000:]
    result = read_result(tmp_path / "result.json")
    assert (result["start_step"], result["steps"], result["world_size"]) == (8, 14, 2)
    assert find_latest_good(tmp_path / "ckpt") == (12, step_dir(tmp_path / "ckpt", 12))
    # No hooks: no heartbeat file anywhere, nothing besides what the script asked for.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "result.json"]
