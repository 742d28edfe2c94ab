"""What the launcher told a training process, read once from its environment.

Under ``unbroken launch`` the node agent sets the torchrun variables (``RANK``, ``WORLD_SIZE``,
...) plus Unbroken's own: ``UNBROKEN_JOB_ID``, ``UNBROKEN_GENERATION``,
``UNBROKEN_HEARTBEAT_FILE``, ``UNBROKEN_WARM_DIR`` (the pod's directory on the node, where a
rank leaves what starts its next process warm) and optionally ``UNBROKEN_CKPT_DIR``. Under
plain ``torchrun`` none of the ``UNBROKEN_*`` variables exist and the process is *unmanaged*:
every hook is a no-op. Only :func:`unbroken.worker.init` calls
:meth:`WorkerEnv.from_environ` with ``os.environ``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

JOB_ID = "UNBROKEN_JOB_ID"
GENERATION = "UNBROKEN_GENERATION"
HEARTBEAT_FILE = "UNBROKEN_HEARTBEAT_FILE"
CKPT_DIR = "UNBROKEN_CKPT_DIR"
WARM_DIR = "UNBROKEN_WARM_DIR"


class WorkerEnvError(ValueError):
    """A launcher variable with a value that is not what it must be."""


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise WorkerEnvError(f"environment variable {name}={raw!r} is not an integer") from None


@dataclass(frozen=True)
class WorkerEnv:
    """The launch context of one rank."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    generation: int = 0
    job_id: str | None = None  # None: not launched by Unbroken
    heartbeat_file: Path | None = None
    ckpt_dir: Path | None = None  # overrides the script's checkpoint directory
    warm_dir: Path | None = None  # :mod:`unbroken.worker.warmstart`

    @property
    def managed(self) -> bool:
        """Whether an Unbroken agent launched this process."""
        return self.job_id is not None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WorkerEnv:
        job_id = environ.get(JOB_ID) or None
        heartbeat = environ.get(HEARTBEAT_FILE) or None
        ckpt_dir = environ.get(CKPT_DIR) or None
        warm_dir = environ.get(WARM_DIR) or None
        # Prefer Unbroken's own generation; torchelastic's restart count is the same number.
        generation = _int(environ, GENERATION, _int(environ, "TORCHELASTIC_RESTART_COUNT", 0))
        return cls(
            rank=_int(environ, "RANK", 0),
            local_rank=_int(environ, "LOCAL_RANK", 0),
            world_size=_int(environ, "WORLD_SIZE", 1),
            generation=generation,
            job_id=job_id,
            heartbeat_file=Path(heartbeat) if heartbeat else None,
            ckpt_dir=Path(ckpt_dir) if ckpt_dir else None,
            warm_dir=Path(warm_dir) if warm_dir else None,
        )


def process_started_at() -> float:
    """When this process started (``time.time()`` scale), from ``/proc``; 0.0 if unknown."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, "starttime"
        since_start_s = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf(
            "SC_CLK_TCK"
        )
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
    return time.time() - since_start_s
