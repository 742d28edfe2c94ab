"""The manager's view of training progress, from the agents' heartbeats.

Each rank's heartbeat record (phase stamps, committed steps) reaches the manager through its
agent. From them the manager learns when a generation's communication was ready, its state was
loaded and its first step committed on every rank: the phases of a recovery.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from unbroken.protocol.messages import RankProgress


@dataclass
class RankView:
    rank: int
    pid: int
    generation: int
    alive: bool = True
    phase: str = "starting"
    step: int = -1
    committed: int = 0
    committed_at: float = 0.0
    start_step: int = -1
    step_time_s: float = 0.0
    compute_time_s: float = 0.0  # step ``committed - 1``: start -> gradient collective; 0: unknown
    tick_at: float = 0.0
    comm_ready_at: float = 0.0
    state_loaded_at: float = 0.0
    first_commit_at: float = 0.0
    recoverable: bool = False  # the worker can rejoin a new group and be repaired in process
    op_retries: int = 0  # gradient all-reduces this process re-executed (op retry)
    op_retry_at: float = 0.0
    op_retry_last: int = 0  # step, attempt and level (unbroken.protocol.heartbeat.pack_op_retry)
    dumped_step: int = -1  # the step of the last words this rank wrote (-1: none)
    dumped_at: float = 0.0
    dump_failed_at: float = 0.0

    def update(self, progress: RankProgress) -> None:
        """Take what the rank's agent saw: its process alive or not and, once the rank wrote
        one, its heartbeat record."""
        self.alive = progress.alive
        rec = progress.record
        if rec is None:
            return
        self.phase = str(rec.phase)
        self.step = rec.step
        self.committed = rec.committed
        self.committed_at = rec.committed_at
        self.start_step = rec.start_step
        self.step_time_s = rec.step_time_s
        self.compute_time_s = rec.compute_time_s
        self.tick_at = rec.tick_at
        self.comm_ready_at = rec.comm_ready_at
        self.state_loaded_at = rec.state_loaded_at
        self.first_commit_at = rec.first_commit_at
        self.recoverable = bool(rec.recoverable)
        self.dumped_step = rec.dumped_step
        self.dumped_at = rec.dumped_at
        self.dump_failed_at = rec.dump_failed_at
        self.op_retries = rec.op_retries
        self.op_retry_at = rec.op_retry_at
        self.op_retry_last = rec.op_retry_last


@dataclass(frozen=True)
class GenerationPhases:
    """When every rank of a generation reached a phase (None: not all there yet)."""

    comm_ready_at: float | None
    state_loaded_at: float | None
    start_step: int | None
    first_commit_at: float | None


def generation_phases(
    ranks: Iterable[RankView], world_size: int, since: float = 0.0
) -> GenerationPhases:
    """``since``: when the generation began; a stamp older than that belongs to an earlier
    generation of a process that lives on (in-process recovery) and does not count.

    One pass, which stops at the first rank that has reached none of the phases (during a
    recovery of 80k ranks, most have not: the manager asks every tick)."""
    views = list(ranks)
    if len(views) < world_size:
        return GenerationPhases(None, None, None, None)
    comm: float | None = 0.0
    state: float | None = 0.0
    first: float | None = 0.0
    starts: set[int] = set()
    for v in views:
        if comm is not None:
            comm = max(comm, v.comm_ready_at) if v.comm_ready_at > since else None
        if state is not None:
            state = max(state, v.state_loaded_at) if v.state_loaded_at > since else None
        if first is not None:
            first = max(first, v.first_commit_at) if v.first_commit_at > since else None
        if comm is None and state is None and first is None:
            return GenerationPhases(None, None, None, None)
        starts.add(v.start_step)
    start = next(iter(starts)) if len(starts) == 1 and -1 not in starts else None
    return GenerationPhases(
        comm_ready_at=comm or None,
        state_loaded_at=state or None,
        start_step=start,
        first_commit_at=first or None,
    )


def committed_step(ranks: Iterable[RankView]) -> int:
    """Steps committed by every rank (the job's progress)."""
    return min((v.committed for v in ranks), default=0)


def median_step_time(ranks: Iterable[RankView]) -> float:
    times = sorted(v.step_time_s for v in ranks if v.step_time_s > 0)
    return times[len(times) // 2] if times else 0.0
