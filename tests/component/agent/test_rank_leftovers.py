"""A rank that dies takes what it left in its process group with it: a child forked with the
rank's sockets (a data loader worker) must not keep the rank's links open for its peers."""

from __future__ import annotations

import os
import queue
import sys
import time
from pathlib import Path

import pytest

from unbroken.agent.ranks import RankExit, RankProcess

pytestmark = pytest.mark.component

RANK = """
import os, sys, time
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
open(sys.argv[1], "w").write(str(child))
sys.exit(3)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_dead_ranks_children_are_ended_with_it(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    child_file = tmp_path / "child"
    exits: queue.Queue[RankExit] = queue.Queue()
    RankProcess(
        rank=0,
        local_rank=0,
        generation=0,
        argv=[sys.executable, str(script), str(child_file)],
        env={"PATH": os.environ.get("PATH", "")},
        log_path=tmp_path / "rank0.log",
        on_exit=exits.put,
    )
    ended = exits.get(timeout=30)
    assert ended.returncode == 3
    child = int(child_file.read_text())
    deadline = time.monotonic() + 5.0
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), f"the rank's child {child} outlived it"
