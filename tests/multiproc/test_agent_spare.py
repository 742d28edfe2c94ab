"""The warm spare agent as a process: it warms its standbys at once, lets them go when its
input ends without an order, and refuses a bad order by name (real standbys, torch imported)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc

DEADLINE_S = 60.0


def _spare(tmp_path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "unbroken.agent.spare", "--nproc", "1", "--log-dir", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _ready_standby(tmp_path: Path) -> int:
    """The pid of the spare's standby once it has imported torch (its log says so)."""
    deadline = time.monotonic() + DEADLINE_S
    log = tmp_path / "standby.log"
    while time.monotonic() < deadline:
        found = re.search(r"standby (\d+) ready", log.read_text() if log.exists() else "")
        if found:
            return int(found.group(1))
        time.sleep(0.1)
    raise AssertionError(f"no standby became ready within {DEADLINE_S} s")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return True
    return state == "Z"


def test_a_spare_without_an_order_lets_its_standbys_go(tmp_path: Path) -> None:
    spare = _spare(tmp_path)
    standby = _ready_standby(tmp_path)
    assert not _gone(standby)
    out, _ = spare.communicate("", timeout=DEADLINE_S)  # end of input: no pod takes it
    assert spare.returncode == 0, out
    assert _gone(standby)


def test_a_bad_order_is_refused_by_name(tmp_path: Path) -> None:
    spare = _spare(tmp_path)
    standby = _ready_standby(tmp_path)
    order = '{"argv": ["--nproc_per_node=1", "train.py"], "cwd": ".", "log": "x"}\n'
    out, _ = spare.communicate(order, timeout=DEADLINE_S)
    assert spare.returncode == 2, out
    assert "the order's 'env' is missing or not a dict" in out, out
    assert _gone(standby)


def test_an_order_for_a_pod_of_another_size_is_refused(tmp_path: Path) -> None:
    spare = _spare(tmp_path)
    _ready_standby(tmp_path)
    order = '{"argv": ["--nproc_per_node=2", "train.py"], "env": {}, "cwd": ".", "log": "x"}\n'
    out, _ = spare.communicate(order, timeout=DEADLINE_S)
    assert spare.returncode == 2, out
    assert "the pod has 2 ranks, this spare 1 slots" in out, out
