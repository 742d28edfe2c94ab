"""Rank processes for the multi-process tests, started the way the node agent starts them.

A rank started as a new Python process imports torch (and DDP's ``torch._dynamo``): 4-5 s of
CPU each, and a test of four ranks spent most of its time there on two cores. The agent's
zygote (:mod:`unbroken.agent.standby`) imports torch once for the whole test process and forks
each rank, which then runs its script as ``__main__`` exactly as the node agent's ranks do
(the differences from ``python script`` are in the zygote's doc: none matters to these tests).
The test process becomes a child subreaper, so a forked rank is its child, waited for by pid.

``UNBROKEN_TEST_COLD_RANKS=1``: every rank a new process, as before.

Besides :func:`start_rank`, what every harness of ranks needs: an environment without any
launcher's variables (:func:`clean_env`), the agent's store of one generation
(:func:`agent_store`) and the variables that point a rank at it (:func:`store_env`), and
:func:`wait_for`.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from unbroken.agent.children import OwnChild, become_subreaper
from unbroken.agent.ranks import Zygote, start_zygote

_zygote: Zygote | None = None
_tried = False


def _the_zygote(log_dir: Path) -> Zygote | None:
    global _zygote, _tried
    if _zygote is not None and _zygote.alive:
        return _zygote
    if _tried and _zygote is None:
        return None
    _tried = True
    if os.environ.get("UNBROKEN_TEST_COLD_RANKS") == "1" or not become_subreaper():
        return None
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    _zygote = start_zygote(env, log_dir / "zygote.log")
    if _zygote is not None:
        atexit.register(_zygote.close)
    return _zygote


def start_rank(
    script: Path, args: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path
) -> subprocess.Popen[bytes] | OwnChild:
    """``python script args`` with ``env`` in ``cwd``, output to ``log_path`` (truncated):
    forked from the test process's zygote, or a new process where there is none."""
    log_path.write_bytes(b"")
    zygote = _the_zygote(log_path.parent)
    if zygote is not None:
        spawn = zygote.order(
            {
                "argv": [str(script), *args],
                "module": False,
                "env": dict(env),
                "cwd": str(cwd),
                "log": str(log_path),
            }
        )
        pid = spawn.wait()
        if pid is not None:
            return OwnChild(pid)
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, str(script), *args],
            env=dict(env),
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def clean_env() -> dict[str, str]:
    """This process's environment without any launcher's variables."""
    drop = ("UNBROKEN_", "TORCHELASTIC_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    return env


def agent_store() -> Any:
    """A TCPStore on loopback that this process owns, as the agent owns one per generation."""
    return dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )


def store_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The variables that make ``rank`` of ``world_size`` join through the agent's store on
    ``port`` (env://, ``TORCHELASTIC_USE_AGENT_STORE``)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


def wait_for(predicate: Callable[[], bool], what: str, deadline_s: float = 180.0) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")
        time.sleep(0.02)
