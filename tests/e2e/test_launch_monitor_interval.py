"""``unbroken launch`` without a job manager, as torchrun runs: two nodes (two launchers on this
machine), one rank each. A rank of node 1 fails; node 1's launcher sees its own rank's exit at
once and moves the job to the next round, and node 0's launcher, which learns of it only from
the rendezvous store, sees it within its ``--monitor_interval`` (Table 2): its rank of the new
round starts at most that long after the failure, plus the time to start a process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.cli_runs import cli_env

pytestmark = pytest.mark.e2e

SCRIPT = """
import os, sys, time
rank, gen = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
def say(what):
    with open(os.environ["EVENTS"], "a") as f:
        f.write(f"{what} {rank} {gen} {time.time():.6f}\\n")
say("start")
if gen == 0 and rank == 1:
    time.sleep(1.0)
    say("fail")
    os._exit(3)
if gen == 0:
    time.sleep(120)  # until its launcher ends it for the next round
"""
#: What a process's start may add to the interval on a loaded two-core machine.
START_SLACK_S = 2.0


def _free_port_block(n: int) -> int:
    import socket

    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base: int = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as t:
                    t.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError("no free block of ports")


@pytest.mark.parametrize("interval_s", [1.0])
def test_a_peer_node_s_failure_is_seen_within_monitor_interval(
    tmp_path: Path, interval_s: float
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    events = tmp_path / "events"
    env = {**cli_env(), "EVENTS": str(events)}
    port = _free_port_block(4)

    def argv(node: int) -> list[str]:
        return [
            *(sys.executable, "-m", "unbroken", "launch", "--nnodes=2", f"--node_rank={node}"),
            *("--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}"),
            *("--max_restarts=1", f"--monitor_interval={interval_s}"),
            *(f"--log_dir={tmp_path / f'logs-{node}'}", str(script)),
        ]

    launchers = [
        subprocess.Popen(
            argv(node), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for node in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=120) for p in launchers]
    finally:
        for p in launchers:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in launchers] == [0, 0], outputs
    seen = {}
    for line in events.read_text().splitlines():
        what, rank, gen, at = line.split()
        seen[(what, int(rank), int(gen))] = float(at)
    failed = seen[("fail", 1, 0)]
    restarted = seen[("start", 0, 1)] - failed
    assert 0.0 < restarted < interval_s + START_SLACK_S, (restarted, seen)
    assert "rank 1 exited 3" in outputs[1][1], outputs[1]
