"""The in-process rungs: healthy ranks keep their processes and regroup.

``retry``, ``recover-in-place``, ``recover`` and a hot switch all end in a *rejoin*. The replica
source's pod (the most advanced healthy replica the heartbeats show) stops at a step boundary
(``pause``), and once its ranks report ``stopping`` the step the source stopped at is known
exactly (not from a heartbeat of a moment ago), so the rejoin names it as the source of the
state the new processes (or the suspect ranks) take. Every other rank stops at its step
boundary when the rejoin reaches it (ranks whose collective already failed are stopped
anyway; so are those whose collective fails because the source's ranks left) and rejoins from
there: one order to each agent, not a pause, an answer and a rejoin each
(:mod:`unbroken.manager.rungs`). In lockstep training every rank stops at the step the source
stopped at; one a step ahead takes the source's state. Without an incident (an elastic
scale-out) every rank is paused and waited for, so that no collective fails outside a
recovery. ``dump`` (last words) stops every healthy rank, then asks the most advanced stopped
replica to write its state.

:class:`InProcess` sends the orders and keeps the rung under way as a value
(:class:`~unbroken.manager.rungs.PendingRejoin`, :class:`~unbroken.manager.rungs.LastWords`)
advanced by the pure steps of :mod:`unbroken.manager.rungs`. What it cannot do is returned
(:class:`~unbroken.manager.engine.Refused`, :class:`~unbroken.manager.engine.NoRoom`); what a
poll finds is returned too (:class:`RejoinReady`, :class:`DumpOver`): the executor decides
what follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from unbroken.faults import Fault, FaultKind
from unbroken.ledger import CheckpointSaved
from unbroken.manager.context import Context
from unbroken.manager.engine import Engine, NoRoom, Outcome, Refused
from unbroken.manager.generations import Generations
from unbroken.manager.incident import Incidents
from unbroken.manager.pool import Pool
from unbroken.manager.recoverlabel import RecoverLabel
from unbroken.manager.rungs import (
    STOP_TIMEOUT_S,
    AskWriter,
    LastWords,
    LastWordsFailed,
    Newcomers,
    NoReplica,
    PendingRejoin,
    RankSeen,
    RejoinFrom,
    Saved,
    Wait,
    WaitFor,
    advance_last_words,
    advance_rejoin,
)
from unbroken.policy import Command, RecoverOnSpare
from unbroken.protocol.messages import EndRanks, JoinFrom, RejoinRanks, WriteLastWords
from unbroken.scheduler import Binding, Unschedulable


@dataclass(frozen=True)
class RejoinReady:
    """Every healthy rank of ``rejoin`` stopped (``all_stopped``; else its deadline
    passed): the rejoin goes out with state from ``source`` at ``step``."""

    rejoin: PendingRejoin
    source: int
    step: int
    all_stopped: bool


@dataclass(frozen=True)
class RejoinFailed:
    """No healthy replica is left for ``rejoin``: the rung failed with ``reason``."""

    rejoin: PendingRejoin
    reason: str


@dataclass(frozen=True)
class DumpOver:
    """Last words are written (``failed`` empty) or have failed: ``then``, the commands that
    followed the dump, run now."""

    then: tuple[Command, ...]
    failed: str = ""


class InProcess:
    """The rejoin and the last words under way (``pending_rejoin``, ``pending_dump``)."""

    def __init__(
        self,
        ctx: Context,
        engine: Engine,
        pool: Pool,
        generations: Generations,
        incidents: Incidents,
    ) -> None:
        self.ctx = ctx
        self.engine = engine
        self.pool = pool
        self.gens = generations
        self.incidents = incidents
        self.pending_rejoin: PendingRejoin | None = None
        self.pending_dump: LastWords | None = None
        #: ``recover`` with no room yet: the pods, and the rung that waits for room for them
        #: (until its deadline, ``wait-reschedule-timeout``).
        self.pending_spare: tuple[tuple[str, ...], int | None] | None = None
        #: ``process-recover-enable`` as the run moves it (``pause`` while a fault is
        #: rescheduled: no process-level rung runs meanwhile).
        self.label = RecoverLabel(ctx)

    @property
    def busy(self) -> bool:
        """Whether a rejoin or last words are under way."""
        return self.pending_rejoin is not None or self.pending_dump is not None

    # ---- what the ranks allow -----------------------------------------------------------
    def recoverable(self) -> bool:
        """Whether every rank's worker can leave a broken group and be repaired in process."""
        ranks = self.gens.ranks
        return bool(ranks) and all(v.recoverable for v in ranks.values())

    def healthy_rank_left(self, faults: Sequence[Fault]) -> bool:
        """Whether a live rank outside the faults is left to be the replica source (looked
        for pod by pod, and only until one is found: 80k ranks at 10k nodes)."""
        named = {r for f in faults for r in f.ranks}
        whole_pods = {f.pod for f in faults if f.pod is not None and not f.ranks}
        lost_nodes = {f.node for f in faults if f.kind is FaultKind.NODE_LOST}
        ranks = self.gens.ranks
        for pod in self.engine.pods.values():
            if pod.lost or not pod.alive or pod.pod in whole_pods or pod.node in lost_nodes:
                continue
            for r in self.ctx.job.ranks_of(pod.pod):
                v = ranks.get(r)
                if v is not None and v.alive and r not in named:
                    return True
        return False

    def seen(self, of_pods: Iterable[str] | None = None) -> dict[int, RankSeen]:
        """Every rank (or those of ``of_pods``) as the rung steps need to see it."""
        out = {}
        pods = self.engine.pods
        views = self.gens.ranks
        job = self.ctx.job
        if of_pods is None:
            ranks: Iterable[int] = views
        else:
            ranks = [r for p in of_pods for r in job.ranks_of(p) if r in views]
        for r in ranks:
            v = views[r]
            pod_name = job.pod_of_rank(r)
            pod = pods.get(pod_name or "")
            out[r] = RankSeen(
                rank=r,
                pod=pod_name,
                alive=v.alive,
                pod_up=pod is not None and not pod.lost and pod.alive,
                pod_known=pod is not None and not pod.lost,
                stopping=v.phase == "stopping",
                committed=v.committed,
                dumped_step=v.dumped_step,
                dumped_at=v.dumped_at,
                dump_failed_at=v.dump_failed_at,
            )
        return out

    def lost_ranks(self, faults: Sequence[Fault]) -> set[int]:
        """Ranks whose state the faults took or made suspect."""
        job = self.ctx.job
        lost: set[int] = set()
        for f in faults:
            lost.update(f.ranks)
            if f.pod is not None and not f.ranks:
                lost.update(job.ranks_of(f.pod))
            if f.kind is FaultKind.NODE_LOST and f.node is not None:
                for p in self.engine.pods.values():
                    if p.node == f.node:
                        lost.update(job.ranks_of(p.pod))
        return lost

    # ---- rejoin -------------------------------------------------------------------------
    def rejoin(
        self,
        replace: Mapping[str, tuple[int, ...]],
        now: float,
        rung: int | None,
        suspect: tuple[int, ...] = (),
        skip_pods: tuple[str, ...] = (),
        replacement: Newcomers | None = None,
        leaving: tuple[int, ...] = (),
    ) -> Refused | None:
        """Process-level recovery, first half: the ranks in ``replace`` end, every healthy
        rank stops at a step boundary. The second half, :meth:`poll_rejoin`, finds when they
        all report ``stopping``."""
        dead = self.engine.dead_pods(skip_pods)
        if dead:
            return Refused(f"pod(s) {', '.join(dead)} have no running agent")
        lost = {r for ranks in replace.values() for r in ranks} | set(suspect)
        pods = self.engine.pods
        for pod, ranks in replace.items():
            if pod in pods:
                self.ctx.commands.send(pod, pods[pod].pid, EndRanks(tuple(ranks)))
        job = self.ctx.job
        if self.incidents.open is None:
            waits_for = {p for p in pods if p not in skip_pods}
        else:
            # The replica source's pod, and a hot switch's leaving pod: the rejoin itself
            # stops every other rank at its step boundary.
            waits_for = {p for r in leaving if (p := job.pod_of_rank(r)) is not None}
            source = self._source_pod(lost | set(leaving), skip_pods)
            if source is not None:
                waits_for.add(source)
        self.engine.pause_pods(sorted(waits_for))
        self.engine.prepare_store()  # while the ranks stop
        self.pending_rejoin = PendingRejoin(
            replace=dict(replace),
            lost=frozenset(lost),
            skip_pods=skip_pods,
            deadline_at=now + STOP_TIMEOUT_S,
            rung=rung,
            waits_for=frozenset(waits_for),
            replacement=replacement,
            leaving=frozenset(leaving),
        )
        return None

    def _source_pod(self, exclude: set[int], skip_pods: Sequence[str]) -> str | None:
        """The pod of the most advanced healthy replica as the heartbeats show it (lowest
        rank first), looked for pod by pod without building every rank's view (80k ranks at
        10k nodes); None when no rank is one."""
        views = self.gens.ranks
        job = self.ctx.job
        best: tuple[int, int, str] | None = None  # (-committed, rank, pod)
        for pod in self.engine.pods.values():
            if pod.lost or not pod.alive or pod.pod in skip_pods:
                continue
            for r in job.ranks_of(pod.pod):
                v = views.get(r)
                if v is None or not v.alive or r in exclude:
                    continue
                key = (-v.committed, r, pod.pod)
                if best is None or key < best:
                    best = key
        return None if best is None else best[2]

    def also_lost(self, rung: int | None, lost: frozenset[int]) -> bool:
        """Another pod of the same decision (rung ``rung``) is lost as well: its ranks join
        the rejoin under way (True), or there is none for that rung (False)."""
        pr = self.pending_rejoin
        if pr is None or pr.rung != rung:
            return False
        self.pending_rejoin = replace(pr, lost=pr.lost | lost)
        return True

    def _a_waited_rank_runs(self, pr: PendingRejoin) -> bool:
        """Whether a rank the rejoin waits for is up and has not stopped yet."""
        views, pods = self.gens.ranks, self.engine.pods
        for name in pr.waits_for:
            pod = pods.get(name)
            if name in pr.skip_pods or pod is None or pod.lost or not pod.alive:
                continue
            for r in self.ctx.job.ranks_of(name):
                v = views.get(r)
                if v is not None and v.alive and v.phase != "stopping" and r not in pr.lost:
                    return True
        return False

    def _waited_up(self, pr: PendingRejoin) -> bool:
        """Whether a pod the rejoin waits for still runs."""
        pods = self.engine.pods
        return any(
            (p := pods.get(name)) is not None and not p.lost and p.alive
            for name in pr.waits_for
            if name not in pr.skip_pods
        )

    def poll_rejoin(self, now: float) -> RejoinReady | RejoinFailed | None:
        """Whether the rejoin under way may go out now (None: not yet)."""
        pr = self.pending_rejoin
        if pr is None:
            return None
        if now < pr.deadline_at and self._a_waited_rank_runs(pr):
            return None  # waited for, without seeing all 80k ranks every tick
        # The ranks waited for stopped: their views are enough, unless their pods went or the
        # deadline passed (then a source is looked for among every rank).
        narrow = now < pr.deadline_at and self._waited_up(pr)
        match advance_rejoin(pr, self.seen(pr.waits_for if narrow else None).values(), now):
            case Wait():
                return None
            case WaitFor(pod=pod):
                self.engine.pause_pods([pod])
                self.pending_rejoin = replace(pr, waits_for=pr.waits_for | {pod})
                return None
            case NoReplica(reason=reason):
                self.pending_rejoin = None
                return RejoinFailed(pr, reason)
            case RejoinFrom(source=source, step=step, all_stopped=all_stopped):
                self.pending_rejoin = None
                return RejoinReady(pr, source, step, all_stopped)

    def drop_rejoin(self) -> None:
        """The rung that paused the ranks was given up: its rejoin must not go out."""
        self.pending_rejoin = None

    def send_rejoin(self, ready: RejoinReady, gen: int, world: tuple[int, ...], plane: str) -> None:
        """Every pod's ranks rejoin generation ``gen`` (``world``: the ranks of a scaled-in
        world, else empty; ``plane``: the network plane to regroup over)."""
        pr = ready.rejoin
        orders = []
        for p in self.engine.pods.values():
            if p.pod in pr.skip_pods:
                continue
            p.generation = gen
            order = RejoinRanks(
                generation=gen,
                master_port=self.engine.master_port,
                source=ready.source,
                step=ready.step,
                replace=tuple(pr.replace.get(p.pod, ())),
                world=world,
                plane=plane,
            )
            orders.append((p.pod, p.pid, order))
            if not order.replace:
                # A pod that starts no process does not announce its rejoin (at 10k nodes,
                # 10k calls while the orders go out): its ranks enter the generation as they
                # are. Before the orders go: 80k views made while the server sends them
                # took the server's loop a second (the interpreter's lock).
                self.gens.carry_over(p.rank_pids)
        self.ctx.commands.send_all(orders)
        what = ", ".join(f"ranks {list(r)} of {p}" for p, r in pr.replace.items())
        self.ctx.console.line(
            f"generation {gen}: healthy processes rejoin in place"
            + (f"; new processes for {what}" if what else "")
            + f"; state from rank {ready.source} (step {ready.step})"
        )

    def start_replacement(self, r: Newcomers, gen: int, join: JoinFrom) -> None:
        """``recover``, once the rejoin is out: the replacement pod's agent starts, its ranks
        joining generation ``gen`` with their state from the replica."""
        self.engine.start_placed(r.bindings, gen, what="replacement pod")
        for b in r.bindings:
            self.engine.pods[b.pod].join = join
        self.incidents.await_replacements(b.pod for b in r.bindings)

    def recover_on_spare(
        self, moved: Sequence[RecoverOnSpare], now: float, rung: int | None
    ) -> Outcome | None:
        """``recover``: the pods are placed on spare nodes together, and the healthy ranks
        rejoin once with all of them (a rack's pods moved one by one would each find the
        others' agents gone)."""
        for cmd in moved:
            self.pool.isolate_all(cmd.isolate_devices, cmd.isolate_nodes)
        pods = tuple(cmd.pod for cmd in moved)
        self.engine.stop(pods, None)
        result = self.pool.place(pods, self.engine.warm_nodes(pods))
        if isinstance(result, Unschedulable):
            self.ctx.console.line(f"cannot place {', '.join(pods)}: {result.reason}")
            if not self.pool.may_pend(self._faults_of(pods)):
                return NoRoom(pods[0], now)
            # Room may come back (isolated devices healthy again): the healthy ranks pause
            # and the pods pend until the rung's deadline, wait-reschedule-timeout.
            self.pending_spare = (pods, rung)
            self.engine.pause_all(pods)
            self.ctx.console.line(
                f"{', '.join(pods)} pend(s) for room until recover's deadline "
                "(wait-reschedule-timeout)"
            )
            return NoRoom(pods[0], now, may_pend=True)
        return self._recover_placed(pods, result.bindings, now, rung)

    def poll_spare(self, now: float, stale: Callable[[int | None], bool]) -> Outcome | None:
        """``recover`` pending for room: placed and recovered once there is room; dropped
        when the policy gave the rung up (its deadline passed)."""
        if self.pending_spare is None:
            return None
        pods, rung = self.pending_spare
        if stale(rung):
            self.pending_spare = None
            return None
        result = self.pool.place(pods, self.engine.warm_nodes(pods))
        if isinstance(result, Unschedulable):
            return None
        self.pending_spare = None
        self.ctx.console.line(
            f"room for {', '.join(pods)} within wait-reschedule-timeout: recovering on "
            f"{', '.join(b.node for b in result.bindings)}"
        )
        return self._recover_placed(pods, result.bindings, now, rung)

    def _faults_of(self, pods: Sequence[str]) -> list[Fault]:
        inc = self.incidents.open
        faults = [inc.fault] if inc is not None else []
        return [f for f in faults if f.pod in pods] or faults

    def _recover_placed(
        self, pods: tuple[str, ...], bindings: Sequence[Binding], now: float, rung: int | None
    ) -> Refused | None:
        result_bindings = tuple(bindings)
        self.pool.bind(result_bindings, say_passed_over=True)
        return self.rejoin(
            replace={},
            now=now,
            rung=rung,
            suspect=tuple(r for pod in pods for r in self.ctx.job.ranks_of(pod)),
            replacement=Newcomers(pod=pods[0], bindings=result_bindings),
        )

    # ---- last words (dump) --------------------------------------------------------------
    def dump(self, now: float, timeout_s: float, faults: Sequence[Fault], rung: int | None) -> None:
        """``dump``, first half: the lost ranks end (a hung one holds its peers inside a
        collective), every other rank stops at a step boundary. :meth:`poll_dump` then asks
        the most advanced healthy replica for its last words and, once they are written (or
        have failed), says so."""
        lost = self.lost_ranks(faults)
        for p in self.engine.running():
            mine = [r for r in self.ctx.job.ranks_of(p.pod) if r in lost]
            if mine:
                self.ctx.commands.send(p.pod, p.pid, EndRanks(tuple(mine)))
        self.engine.pause_all()
        self.ctx.console.line("last words: healthy ranks stop at a step boundary")
        self.pending_dump = LastWords(
            lost=frozenset(lost),
            stop_deadline_at=now + STOP_TIMEOUT_S,
            deadline_at=now + timeout_s,
            began_at=now,
            rung=rung,
        )

    def hold_after_dump(self, commands: Sequence[Command]) -> None:
        """``commands`` run once the last words under way are done."""
        assert self.pending_dump is not None
        self.pending_dump = replace(self.pending_dump, then=tuple(commands))

    def poll_dump(self, now: float) -> DumpOver | None:
        pd = self.pending_dump
        if pd is None:
            return None
        pd, step = advance_last_words(pd, self.seen(), now)
        self.pending_dump = pd
        console = self.ctx.console
        match step:
            case Wait():
                return None
            case AskWriter(rank=rank, step=at_step):
                pod = self.engine.pods[self.ctx.job.pod_of_rank(rank) or ""]
                self.ctx.commands.send(pod.pod, pod.pid, WriteLastWords(rank))
                console.line(f"last words: rank {rank} saves step {at_step}")
                return None
            case Saved(rank=rank, step=at_step, dumped_at=dumped_at, took_s=took_s):
                self.ctx.ledger.record(
                    CheckpointSaved(step=at_step, path="", duration_s=took_s, last_words=True),
                    at=dumped_at,
                )
                console.line(f"last words: rank {rank} saved step {at_step} ({took_s:.2f} s)")
                self.pending_dump = None
                return DumpOver(pd.then)
            case LastWordsFailed(reason=reason):
                # Not a failure of the rung that follows: it resumes from the periodic
                # checkpoint.
                self.pending_dump = None
                self.ctx.ledger.record_raw("LastWordsFailed", {"reason": reason})
                console.line(f"last words failed: {reason}; the periodic checkpoint is used")
                return DumpOver(pd.then, failed=reason)
        return None
