"""``unbroken launch`` without a job manager: torchrun's job, with restarts that work."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc

SCRIPT = """
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1) * rank
dist.all_reduce(t)
gen = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {rank} world {dist.get_world_size()} sum {t.item():.0f} round {gen}", flush=True)
if rank == 1 and gen < int(os.environ.get("FAIL_ROUNDS", "1")):
    os._exit(3)
dist.barrier()
dist.destroy_process_group()
"""


def _free_port_block(n: int) -> int:
    """A port p with p..p+n-1 free now (the agent uses one store port per round)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free block of ports")


def _launch(
    tmp_path: Path, max_restarts: int, fail_rounds: int
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", FAIL_ROUNDS=str(fail_rounds))
    env.pop("UNBROKEN_CONTROL", None)
    argv = [
        sys.executable,
        "-m",
        "unbroken",
        "launch",
        "--nproc-per-node",
        "2",
        "--max_restarts",
        str(max_restarts),
        "--monitor_interval",
        "0.2",
        "--master_port",
        str(_free_port_block(4)),
        "--log_dir",
        str(tmp_path / "logs"),
        str(script),
    ]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_a_failed_rank_restarts_the_round_with_a_fresh_store(tmp_path: Path) -> None:
    done = _launch(tmp_path, max_restarts=2, fail_rounds=1)
    assert done.returncode == 0, done.stderr
    assert "rank 1 exited 3" in done.stderr
    assert "restarting ranks into round 1" in done.stderr
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("rank*.log")))
    assert "rank 0 world 2 sum 1 round 1" in logs
    assert "rank 1 world 2 sum 1 round 1" in logs


def test_restarts_are_bounded_by_max_restarts(tmp_path: Path) -> None:
    done = _launch(tmp_path, max_restarts=1, fail_rounds=5)
    assert done.returncode == 1
    assert "giving up after 1 restarts (--max_restarts)" in done.stderr
