"""A checkpoint save stuck on a peer that never joins it is let go: its group's links are cut,
the save fails at once, and the process exits instead of waiting out the group's timeout."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from worker_ranks import clean_env

from unbroken.checkpoint import find_latest_good

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

RANK = Path(__file__).with_name("stuck_save_rank.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_abandoned_save_stuck_on_a_peer_fails_at_once_and_the_rank_exits(
    tmp_path: Path,
) -> None:
    port = _free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(RANK), str(rank), str(port), str(tmp_path / "ckpt")],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outs = []
    try:
        for proc in ranks:
            # The group's timeout is 600 s: exiting within 120 s needs the links cut.
            outs.append(proc.communicate(timeout=120))
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    (out0, err0), (_out1, err1) = outs
    assert [p.returncode for p in ranks] == [0, 0], (err0, err1)
    assert out0.startswith("abandoned after "), (out0, err0)
    assert "link(s) of its group were cut" in err0, err0
    assert find_latest_good(tmp_path / "ckpt") is None  # never committed, never loaded
