"""The manager's view of training progress, from the agents' heartbeats.

Each rank's heartbeat record (phase stamps, committed steps) reaches the manager through its
agent. From them the manager learns when a generation's communication was ready, its state was
loaded and its first step committed on every rank: the phases of a recovery.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from unbroken.ledger import CheckpointSaved, Ledger
from unbroken.manager.console import Console
from unbroken.protocol.kinds import StepFailure
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
    comm_time_s: float = 0.0  # step ``committed - 1``: last gradient bucket -> all reduced
    tick_at: float = 0.0
    comm_ready_at: float = 0.0
    state_loaded_at: float = 0.0
    first_commit_at: float = 0.0
    recoverable: bool = False  # the worker can rejoin a new group and be repaired in process
    session: bool = False  # the process wrote a heartbeat record: it started an Unbroken session
    op_retries: int = 0  # op retries (re-executions) that succeeded in this process
    op_retry_at: float = 0.0
    op_retry_last: int = 0  # step, attempt and level (unbroken.protocol.heartbeat.pack_op_retry)
    #: Steps this process redid on its own (a MindSpore rank's retry: unbroken.mindspore),
    #: and why the last one failed (a StepFailure code).
    recoveries: int = 0
    failure: int = 0
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
        self.session = True
        self.phase = str(rec.phase)
        self.step = rec.step
        self.committed = rec.committed
        self.committed_at = rec.committed_at
        self.start_step = rec.start_step
        self.step_time_s = rec.step_time_s
        self.compute_time_s = rec.compute_time_s
        self.comm_time_s = rec.comm_time_s
        self.tick_at = rec.tick_at
        self.comm_ready_at = rec.comm_ready_at
        self.state_loaded_at = rec.state_loaded_at
        self.first_commit_at = rec.first_commit_at
        self.recoverable = bool(rec.recoverable)
        self.dumped_step = rec.dumped_step
        self.dumped_at = rec.dumped_at
        self.dump_failed_at = rec.dump_failed_at
        self.op_retries = rec.op_retries
        self.recoveries = rec.recoveries
        self.failure = rec.failure
        self.op_retry_at = rec.op_retry_at
        self.op_retry_last = rec.op_retry_last


@dataclass(frozen=True)
class GenerationPhases:
    """When every rank of a generation reached a phase (None: not all there yet)."""

    comm_ready_at: float | None
    state_loaded_at: float | None
    start_step: int | None
    first_commit_at: float | None


class PhaseWatch:
    """When every rank of the generation reached each phase, kept up to date as ranks report.

    The manager asks every tick while a generation starts; at 80k ranks a scan of every rank
    each tick was the manager's whole CPU while the ranks' first records came in. Here a
    rank's stamps are counted when it is touched (its view replaced or updated), so a tick
    costs what changed since the last one. ``since``: when the generation began; a stamp
    older than that belongs to an earlier generation of a process that lives on (in-process
    recovery) and does not count.
    """

    def __init__(self) -> None:
        self._key: tuple[int, float] | None = None
        #: Per rank: the phase stamps and start step counted for it.
        self._seen: dict[int, tuple[float, float, float, int]] = {}
        self._dirty: set[int] = set()
        self._count = [0, 0, 0]
        self._latest = [0.0, 0.0, 0.0]
        self._latest_stale = False
        self._starts: Counter[int] = Counter()

    def touch(self, rank: int) -> None:
        """``rank``'s view was replaced or updated."""
        self._dirty.add(rank)

    def _reset(self, key: tuple[int, float], ranks: Mapping[int, RankView]) -> None:
        self._key = key
        self._seen.clear()
        self._count = [0, 0, 0]
        self._latest = [0.0, 0.0, 0.0]
        self._latest_stale = False
        self._starts.clear()
        self._dirty = set(ranks)

    def _count_dirty(self, ranks: Mapping[int, RankView], since: float) -> None:
        for rank in self._dirty:
            v = ranks.get(rank)
            new = (
                None
                if v is None
                else (v.comm_ready_at, v.state_loaded_at, v.first_commit_at, v.start_step)
            )
            old = self._seen.pop(rank, None)
            if new is not None:
                self._seen[rank] = new
            if old == new:
                continue
            if old is not None:
                for i in range(3):
                    if old[i] > since:
                        self._count[i] -= 1
                        if old[i] >= self._latest[i] and (new is None or new[i] < old[i]):
                            self._latest_stale = True
                self._starts[old[3]] -= 1
                if not self._starts[old[3]]:
                    del self._starts[old[3]]
            if new is not None:
                for i in range(3):
                    if new[i] > since:
                        self._count[i] += 1
                        self._latest[i] = max(self._latest[i], new[i])
                self._starts[new[3]] += 1
        self._dirty.clear()

    def phases(
        self, ranks: Mapping[int, RankView], world_size: int, generation: int, since: float
    ) -> GenerationPhases:
        if self._key != (generation, since):
            self._reset((generation, since), ranks)
        self._count_dirty(ranks, since)
        if len(self._seen) != len(ranks):  # a view added or removed untouched: count afresh
            self._reset((generation, since), ranks)
            self._count_dirty(ranks, since)
        n = len(self._seen)
        if n < world_size:
            return GenerationPhases(None, None, None, None)
        if self._latest_stale:
            self._latest = [
                max((s[i] for s in self._seen.values() if s[i] > since), default=0.0)
                for i in range(3)
            ]
            self._latest_stale = False
        comm, state, first = (
            self._latest[i] if self._count[i] == n and self._latest[i] else None for i in range(3)
        )
        if comm is None and state is None and first is None:
            return GenerationPhases(None, None, None, None)
        starts = self._starts
        start = next(iter(starts)) if len(starts) == 1 and -1 not in starts else None
        return GenerationPhases(
            comm_ready_at=comm, state_loaded_at=state, start_step=start, first_commit_at=first
        )


def committed_step(ranks: Iterable[RankView]) -> int:
    """Steps committed by every rank (the job's progress)."""
    return min((v.committed for v in ranks), default=0)


def median_step_time(ranks: Iterable[RankView]) -> float:
    times = sorted(v.step_time_s for v in ranks if v.step_time_s > 0)
    return times[len(times) // 2] if times else 0.0


def rank_recovered_alone(
    view: RankView,
    was: tuple[int, float],
    heard: set[tuple[int, float]],
    ledger: Ledger,
    console: Console,
) -> None:
    """What a rank that cannot be repaired in process (a MindSpore rank,
    :mod:`unbroken.mindspore`) did on its own since its record said ``was`` (its recoveries,
    its last words' time): a step it redid after its device memory or link failed (the seed's
    UCE and HCCE retry: no fault for the policy), last words it wrote (TTP, kept in ``heard``).
    Recorded and said."""
    recoveries, dumped_at = was
    if view.recoveries > recoveries:
        why = "device memory" if view.failure == StepFailure.DEVICE_MEMORY else "link"
        ledger.record_raw(
            "StepRedone",
            {"rank": view.rank, "step": view.step, "failure": why, "redone": view.recoveries},
            at=time.time(),
        )
        console.line(
            f"rank {view.rank}: step {view.step} redone in process after a {why} error "
            f"(retry, {view.recoveries} in this process); no recovery needed"
        )
    if view.dumped_at > dumped_at and view.dumped_step >= 0:
        _last_words(view.rank, view.dumped_step, view.dumped_at, heard, ledger, console)


def last_words_of_ended(
    rows: Iterable[RankProgress],
    since: float,
    heard: set[tuple[int, float]],
    ledger: Ledger,
    console: Console,
) -> None:
    """Last words a rank that cannot be repaired in process wrote as its generation was
    stopped (a MindSpore rank's TTP, after ``since``: the generation's start): its agent's
    heartbeats still carry the ended generation. Each is recorded once (``heard``)."""
    for row in rows:
        rec = row.record
        if rec is None or rec.recoverable or rec.dumped_step < 0 or rec.dumped_at <= since:
            continue
        if (row.rank, rec.dumped_at) not in heard:
            _last_words(row.rank, rec.dumped_step, rec.dumped_at, heard, ledger, console)


def _last_words(
    rank: int,
    step: int,
    at: float,
    heard: set[tuple[int, float]],
    ledger: Ledger,
    console: Console,
) -> None:
    """Last words ``rank`` wrote of ``step``: recorded and said, and kept in ``heard`` (said
    once, its generation over or not)."""
    heard.add((rank, at))
    ledger.record(CheckpointSaved(step=step, path="", duration_s=0.0, last_words=True), at=at)
    console.line(f"last words: rank {rank} saved step {step}")
