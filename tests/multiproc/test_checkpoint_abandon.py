"""A checkpoint save stuck on a peer that never joins it is let go: its group's links are cut,
the save fails at once, and the process exits instead of waiting out the group's timeout."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.ranks import clean_env

from unbroken.checkpoint import find_latest_good

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

RANK = Path(__file__).with_name("stuck_save_rank.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_ranks(tmp_path: Path, *flags: str) -> list[tuple[int, str, str]]:
    """Run both ranks to their end; (returncode, stdout, stderr) of each."""
    port = _free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(RANK), str(rank), str(port), str(tmp_path / "ckpt"), *flags],
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
    return [(p.returncode, out, err) for p, (out, err) in zip(ranks, outs, strict=True)]


def test_an_abandoned_save_stuck_on_a_peer_fails_at_once_and_the_rank_exits(
    tmp_path: Path,
) -> None:
    (rc0, out0, err0), (rc1, _out1, err1) = _run_ranks(tmp_path)
    assert [rc0, rc1] == [0, 0], (err0, err1)
    assert out0.startswith("abandoned after "), (out0, err0)
    assert "link(s) of its group were cut" in err0, err0
    assert find_latest_good(tmp_path / "ckpt") is None  # never committed, never loaded


def test_a_save_left_stuck_does_not_hold_the_process_at_exit(tmp_path: Path) -> None:
    # No link to cut: the save still waits on its peer when rank 0 exits. Its thread must not
    # be one the interpreter's exit waits for (600 s, the group's timeout).
    (rc0, out0, err0), (rc1, _out1, err1) = _run_ranks(tmp_path, "--no-cut")
    assert [rc0, rc1] == [0, 0], (err0, err1)
    assert out0.startswith("abandoned after "), (out0, err0)
    assert "its save is stuck" in err0, err0
    assert find_latest_good(tmp_path / "ckpt") is None
