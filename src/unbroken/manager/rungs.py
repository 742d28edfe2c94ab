"""The multi-step rungs as values: each step is a pure function of the rung and of the ranks
as the manager sees them now, returning the rung's next value and what to do.

Process-level recovery cannot be done in one go: the healthy ranks first stop at a step
boundary (``pause``), and only once they all did is the replica source and its step known
exactly (rather than from a heartbeat of a moment ago). So:

- :class:`PendingRejoin` (``retry``, ``recover-in-place``, ``recover``, a hot switch): waits until
  the healthy ranks of the pods it ``waits_for`` stopped (or :data:`STOP_TIMEOUT_S` passed),
  then says :class:`RejoinFrom` the most advanced of them, or :class:`NoReplica`; when those
  pods are gone first, :class:`WaitFor` names the pod of another replica to pause. While an
  incident is recovered the rejoin waits for one pod, the replica source's: the one step the
  rejoin must name exactly is the one that pod stopped at, and every other rank stops at its
  step boundary when the rejoin itself reaches it (a collective of a rank still in a step then
  fails, which is no fault while an incident is recovered). At 10k nodes this is one order to
  each agent instead of a pause, an answer from each, then the rejoin. Without an incident (an
  elastic scale-out) it waits for every pod, as every rank is paused. ``recover`` and a hot
  switch carry the :class:`Newcomers` pod to start once the rejoin goes out; a hot switch also
  names the ``leaving`` ranks (the sub-healthy pod's), whose pod is waited for too: healthy,
  so they stop at the step boundary, but never the source, since they do not join the new
  generation;
- :class:`LastWords` (``dump``): waits for the healthy ranks to stop, then asks the most
  advanced stopped replica to write its state (:class:`AskWriter`), then reports it
  :class:`Saved` or :class:`LastWordsFailed` (died, could not, or too slow); the commands that
  followed the dump in the decision run after it.

Every rung value carries ``rung``, the policy generation of the rung it carries out, so the
outcome events it causes name it (a stale outcome of a rung given up is ignored by the
policy). The in-process rungs (:mod:`unbroken.manager.inprocess`) send the orders and keep the
value; the executor (:mod:`unbroken.manager.executor`) polls them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from unbroken.policy import Command
from unbroken.scheduler import Binding

#: How long the healthy ranks get to stop at a step boundary before last words or a rejoin.
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RankSeen:
    """A rank as the rung steps see it. ``pod_up``: its pod is known, its agent alive and
    not lost; ``pod_known``: its pod is known and not lost (the agent may be ending)."""

    rank: int
    pod: str | None
    alive: bool
    pod_up: bool
    pod_known: bool
    stopping: bool
    committed: int
    dumped_step: int = -1
    dumped_at: float = 0.0
    dump_failed_at: float = 0.0


def replica_source(
    ranks: Iterable[RankSeen], exclude: Iterable[int], *, stopped: bool = False
) -> tuple[int, int] | None:
    """The replica source (most advanced healthy rank, lowest rank first) and its step;
    ``stopped``: only a rank stopped at a step boundary (out of every group)."""
    out = set(exclude)
    best: tuple[int, int] | None = None
    for v in sorted(ranks, key=lambda v: v.rank):
        if v.rank in out or not v.alive or (stopped and not v.stopping) or not v.pod_up:
            continue
        if best is None or v.committed > best[1]:
            best = (v.rank, v.committed)
    return best


@dataclass(frozen=True)
class Wait:
    """Nothing to do yet."""


# ---- rejoin ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Newcomers:
    """``recover``: the pod placed on a spare node, whose agent starts once the rejoin is out
    and whose ranks take their state from the replica."""

    pod: str
    bindings: tuple[Binding, ...]


@dataclass(frozen=True)
class PendingRejoin:
    """A rejoin waiting for ranks to stop; ``replace``: ranks given new processes per pod;
    ``lost``: ranks whose state cannot be a replica; pods in ``skip_pods`` take no part;
    ``waits_for``: the pods whose healthy ranks were paused and must stop before the rejoin
    goes out (the replica source's, a hot switch's leaving pod; every pod without an
    incident); ``leaving``: ranks that stop with the others but leave the job (a hot switch's
    old pod), so they are waited for and never the source."""

    replace: Mapping[str, tuple[int, ...]]
    lost: frozenset[int]
    skip_pods: tuple[str, ...]
    deadline_at: float
    rung: int | None
    waits_for: frozenset[str]
    replacement: Newcomers | None = None
    leaving: frozenset[int] = frozenset()


@dataclass(frozen=True)
class RejoinFrom:
    """Send the rejoin: state from ``source`` at ``step``; ``all_stopped``: False when the
    deadline passed before the ranks waited for stopped."""

    source: int
    step: int
    all_stopped: bool


@dataclass(frozen=True)
class NoReplica:
    reason: str = "no healthy replica is left"


@dataclass(frozen=True)
class WaitFor:
    """The pods waited for are gone before their ranks stopped: pause ``pod`` (the most
    advanced replica left) and wait for it too."""

    pod: str


def advance_rejoin(
    r: PendingRejoin, ranks: Iterable[RankSeen], now: float
) -> Wait | RejoinFrom | NoReplica | WaitFor:
    """The rejoin's next step. ``ranks``: at least the ranks of the pods it waits for; every
    rank once they are gone or the deadline passed (a new source is looked for among them)."""
    seen = list(ranks)
    waited = [
        v
        for v in seen
        if v.pod in r.waits_for and v.rank not in r.lost and v.alive and v.pod not in r.skip_pods
    ]
    stopped = bool(waited) and all(v.stopping for v in waited)
    if stopped:
        source = replica_source(waited, r.lost | r.leaving, stopped=True)
        if source is not None:
            return RejoinFrom(source=source[0], step=source[1], all_stopped=True)
    exclude = r.lost | r.leaving
    if now < r.deadline_at:
        if replica_source(waited, exclude) is not None:
            return Wait()
        # No replica is left in the pods waited for (the source's node went too): the most
        # advanced one left elsewhere is paused and waited for.
        other = replica_source((v for v in seen if v.pod not in r.skip_pods), exclude)
        if other is None:
            return NoReplica()
        pod = next(v.pod for v in seen if v.rank == other[0])
        return Wait() if pod is None or pod in r.waits_for else WaitFor(pod)
    source = replica_source((v for v in seen if v.pod not in r.skip_pods), exclude)
    if source is None:
        return NoReplica()
    return RejoinFrom(source=source[0], step=source[1], all_stopped=stopped)


# ---- last words --------------------------------------------------------------------------
@dataclass(frozen=True)
class LastWords:
    """``dump`` in progress; ``then``: the commands of the decision that follow it;
    ``writer``: (rank, step) once asked, at ``asked_at``."""

    lost: frozenset[int]
    stop_deadline_at: float
    deadline_at: float
    began_at: float
    rung: int | None
    then: tuple[Command, ...] = ()
    writer: tuple[int, int] | None = None
    asked_at: float = 0.0


@dataclass(frozen=True)
class AskWriter:
    rank: int
    step: int


@dataclass(frozen=True)
class Saved:
    rank: int
    step: int
    dumped_at: float
    took_s: float


@dataclass(frozen=True)
class LastWordsFailed:
    reason: str


LastWordsStep = Wait | AskWriter | Saved | LastWordsFailed


def advance_last_words(
    lw: LastWords, ranks: Mapping[int, RankSeen], now: float
) -> tuple[LastWords, LastWordsStep]:
    if lw.writer is None:
        healthy = [v for v in ranks.values() if v.rank not in lw.lost and v.alive and v.pod_known]
        stopped = bool(healthy) and all(v.stopping for v in healthy)
        if not stopped and now < lw.stop_deadline_at:
            return lw, Wait()
        writer = replica_source(ranks.values(), lw.lost, stopped=True)
        if writer is None:
            return lw, LastWordsFailed("no healthy rank stopped at a step boundary")
        return replace(lw, writer=writer, asked_at=now), AskWriter(*writer)
    rank, step = lw.writer
    v = ranks.get(rank)
    if v is not None and v.dumped_at > lw.asked_at and v.dumped_step == step:
        return lw, Saved(rank, step, v.dumped_at, v.dumped_at - lw.asked_at)
    if v is None or not v.alive:
        return lw, LastWordsFailed(f"rank {rank} died writing them")
    if v.dump_failed_at > lw.asked_at:
        return lw, LastWordsFailed(f"rank {rank} could not write them (see its log)")
    if now >= lw.deadline_at:
        return lw, LastWordsFailed(f"rank {rank} did not finish within the dump timeout")
    return lw, Wait()
