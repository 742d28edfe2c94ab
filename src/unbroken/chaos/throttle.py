"""A slow node, made real: its processes limited to a share of one CPU by a cgroup (v1 ``cpu``
controller: ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``). Standard library only.

:func:`throttle` creates a child cgroup ``unbroken-<name>`` under ``root`` and moves whole
processes into it (``cgroup.procs``: every thread of each), noting the cpu cgroup each came from
(``/proc/PID/cgroup``); :func:`release` moves each process still there back to the cgroup it came
from (to ``root`` where that cgroup is gone) and removes the throttle's cgroup. A process that
exited in between is skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
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


@dataclass
class Throttled:
    """A throttle's cgroup, and the cpu cgroup each process came from."""

    group: Path
    origins: dict[int, Path] = field(default_factory=dict)


def cpu_cgroup(pid: int, root: Path = CPU_ROOT) -> Path | None:
    """The cgroup v1 cpu cgroup ``pid`` is in (under ``root``); None when it has exited."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return root / path.lstrip("/")
    return root


def throttle(name: str, pids: list[int], cpu: float, root: Path = CPU_ROOT) -> Throttled:
    """Limit ``pids`` together to ``cpu`` of one CPU (0.01-1.0)."""
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
    out = Throttled(group)
    for pid in pids:
        origin = cpu_cgroup(pid, root)
        if origin is not None and origin != group:
            out.origins[pid] = origin
    _move(pids, group)
    return out


def release(throttled: Throttled) -> None:
    """Move the processes still in the throttle's cgroup back to where each came from (its
    parent where that cgroup is gone, or for a process that started inside the throttle) and
    remove the cgroup; nothing if it is gone."""
    group = throttled.group
    if not group.is_dir():
        return
    for pid in [int(p) for p in (group / "cgroup.procs").read_text().split()]:
        origin = throttled.origins.get(pid, group.parent)
        _move([pid], origin if origin.is_dir() else group.parent)
    group.rmdir()


def _move(pids: list[int], group: Path) -> None:
    for pid in pids:
        try:
            (group / "cgroup.procs").write_text(f"{pid}\n")
        except ProcessLookupError:
            continue  # it exited
        except OSError as exc:
            raise ThrottleError(f"cannot move pid {pid} into {group}: {exc}") from None
