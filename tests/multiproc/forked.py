"""Rank processes for the multi-process tests, forked from one zygote per test process.

A rank started as a new Python process imports torch (and DDP's ``torch._dynamo``): 4-5 s of
CPU each, and a test of four ranks spent most of its time there on two cores. The agent's
zygote (:mod:`unbroken.agent.standby`) imports torch once for the whole test process and forks
each rank, which then runs its script as ``__main__`` exactly as the node agent's ranks do
(the differences from ``python script`` are in the zygote's doc: none matters to these tests).
The test process becomes a child subreaper, so a forked rank is its child, waited for by pid.

``UNBROKEN_TEST_COLD_RANKS=1``: every rank a new process, as before.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from unbroken.agent.image import OwnChild
from unbroken.agent.ranks import Zygote, become_subreaper, start_zygote

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
