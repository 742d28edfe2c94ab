"""The job's status snapshot: one row the manager overwrites, for ``unbroken status``.

The events are the history; the snapshot is "where is the job now" without replaying them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class JobPhase(StrEnum):
    """Where the job is in its life."""

    PENDING = "Pending"  # accepted, pods not yet all placed and started
    RUNNING = "Running"  # training
    RECOVERING = "Recovering"  # an incident is being handled
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = "Stopped"  # stopped by the user (SIGINT, SIGTERM), every process ended

    @property
    def finished(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.STOPPED)


@dataclass(frozen=True)
class PodStatus:
    """One pod: where it runs and its training processes (empty ``node`` while pending)."""

    name: str
    node: str = ""
    devices: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()
    pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class JobStatus:
    """The snapshot. ``message`` says why the job failed, or what a recovery is doing."""

    job: str
    phase: JobPhase
    generation: int
    step: int
    total_steps: int | None
    pods: tuple[PodStatus, ...]
    started_at: float
    updated_at: float
    faults: int = 0
    recoveries: int = 0
    message: str = ""
