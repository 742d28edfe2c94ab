"""Start a benchmark's ranks: one process per rank on 127.0.0.1, as an Unbroken agent would.

Each rank runs ``script --rank-worker --out OUT ARGS...`` with the launcher's environment (a
rendezvous store this process hosts, ``TORCHELASTIC_USE_AGENT_STORE``, a heartbeat file and,
with ``mailbox``, a recovery mailbox, so in-process recovery is on); rank 0 writes its result
as JSON to ``OUT``, which :func:`run_ranks` returns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist


def run_ranks(
    script: str,
    world: int,
    args: Callable[[Path], list[str]],
    *,
    mailbox: bool,
) -> dict[str, Any]:
    """Run ``world`` ranks of ``script`` to their end; ``args(tmp)`` gives their arguments
    (``tmp``: a scratch directory removed afterwards)."""
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120)
    )
    with tempfile.TemporaryDirectory(prefix="ub-bench-") as tmp:
        out = Path(tmp) / "result.json"
        procs = []
        for rank in range(world):
            env = dict(os.environ)
            env.update(
                {
                    "OMP_NUM_THREADS": "1",
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(world),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(store.port),
                    "TORCHELASTIC_USE_AGENT_STORE": "True",
                    "TORCHELASTIC_RESTART_COUNT": "0",
                    "UNBROKEN_JOB_ID": "bench",
                    "UNBROKEN_GENERATION": "0",
                    "UNBROKEN_HEARTBEAT_FILE": str(Path(tmp) / f"hb-rank{rank}"),
                }
            )
            if mailbox:
                env["UNBROKEN_MAILBOX"] = str(Path(tmp) / f"mb-rank{rank}")
            argv = [sys.executable, script, "--rank-worker", "--out", str(out), *args(Path(tmp))]
            procs.append(subprocess.Popen(argv, env=env))
        codes = [p.wait() for p in procs]
        if codes != [0] * world:
            raise SystemExit(f"ranks exited with {codes}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result
