"""A slow node, made real: its processes limited to a share of one CPU by a cgroup (v1 ``cpu``
controller: ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``). Standard library only.

:func:`throttle` creates a child cgroup ``unbroken-<name>`` under ``root`` and moves whole
processes into it (``cgroup.procs``: every thread of each); :func:`release` moves what is left
back to ``root`` and removes the cgroup. A process that exited in between is skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The cgroup v1 cpu controller's usual mount.
CPU_ROOT = Path("/sys/fs/cgroup/cpu")
#: The scheduler period the quota is a share of.
PERIOD_US = 100_000


class ThrottleError(RuntimeError):
    """The cgroup could not be made or written (no cgroup v1 cpu controller, no permission)."""


def unavailable(root: Path = CPU_ROOT) -> str | None:
    """Why processes cannot be throttled under ``root``; None when they can."""
    if not (root / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {root}"
    if not os.access(root, os.W_OK):
        return f"{root} is not writable (throttling needs root)"
    return None


def throttle(name: str, pids: list[int], cpu: float, root: Path = CPU_ROOT) -> Path:
    """Limit ``pids`` together to ``cpu`` of one CPU (0.01-1.0); returns the cgroup."""
    if not 0.01 <= cpu <= 1.0:
        raise ValueError(f"cpu {cpu} is out of range (0.01-1.0 of one CPU)")
    why = unavailable(root)
    if why is not None:
        raise ThrottleError(why)
    group = root / f"unbroken-{name}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
        (group / "cpu.cfs_quota_us").write_text(f"{int(cpu * PERIOD_US)}\n")
    except OSError as exc:
        raise ThrottleError(f"cannot set up cgroup {group}: {exc}") from None
    _move(pids, group)
    return group


def release(group: Path) -> None:
    """Move the processes of ``group`` back to its parent and remove it; nothing if it is gone."""
    if not group.is_dir():
        return
    pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
    _move(pids, group.parent)
    group.rmdir()


def _move(pids: list[int], group: Path) -> None:
    for pid in pids:
        try:
            (group / "cgroup.procs").write_text(f"{pid}\n")
        except ProcessLookupError:
            continue  # it exited
        except OSError as exc:
            raise ThrottleError(f"cannot move pid {pid} into {group}: {exc}") from None
