"""Carrying out the policy's decisions on the embedded cluster.

The policy decides (:func:`unbroken.policy.decide`); :class:`Executor` feeds it events, keeps
its state, and hands each command to the part that does it: the device pool (isolation), the
engine (restarts, rescheduling, placements), the in-process rungs (rejoin, last words, recover
on a spare node), the hot switcher and elastic training. Those parts return what they could not
do (:mod:`unbroken.manager.engine`'s outcomes); the executor turns each into the policy's next
event, so a failed rung always falls to the next one, or into the job's end.

Every outcome fed back names the policy generation of the rung it belongs to, so an outcome of a
rung the policy has given up is ignored as stale. Multi-step rungs are values advanced by the
pure steps of :mod:`unbroken.manager.rungs`; the executor polls them on the manager's tick
(:meth:`Executor.poll_rejoin`, :meth:`Executor.poll_dump`) and carries out what they found.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from unbroken.faults import Fault, FaultKind, FaultLevel
from unbroken.ledger import DecisionMade
from unbroken.manager.context import Context
from unbroken.manager.engine import CannotRun, Engine, NoRoom, Outcome, Refused, Terms
from unbroken.manager.generations import Generations
from unbroken.manager.hotswitch import HotSwitcher
from unbroken.manager.incident import Incidents
from unbroken.manager.inprocess import InProcess, RejoinFailed, RejoinReady
from unbroken.manager.planes import PlaneSwitcher
from unbroken.manager.pool import Pool
from unbroken.manager.scaling import Elastic
from unbroken.policy import (
    BackOff,
    Command,
    DeprioritiseNode,
    DumpLastWords,
    FailJob,
    FaultReported,
    HotSwitch,
    IsolateDevice,
    IsolateNode,
    JobState,
    PodUnschedulable,
    Recovering,
    RecoverOnSpare,
    RescheduleJob,
    ReschedulePods,
    RestartInPlace,
    RestartProcesses,
    RetryOnline,
    Rung,
    RungFailed,
    RungSucceeded,
    Running,
    ScaleIn,
    decide,
)
from unbroken.policy import Event as PolicyEvent
from unbroken.policy.planes import PlaneConfig
from unbroken.protocol.messages import CutPlane, JoinFrom

log = logging.getLogger(__name__)


class Executor:
    """The policy's state (``policy_state``, fed only here) and the carrying out of its
    commands.

    Args:
        ctx: the job, the cluster and the run's sinks.
        engine, pool, generations, incidents, inprocess, hotswitch, elastic: the parts that
            carry commands out.
        finish: ends the job (succeeded, reason).
        finished: whether the job has ended.
    """

    def __init__(
        self,
        ctx: Context,
        *,
        engine: Engine,
        pool: Pool,
        generations: Generations,
        incidents: Incidents,
        inprocess: InProcess,
        hotswitch: HotSwitcher,
        elastic: Elastic,
        finish: Callable[[bool, str], None],
        finished: Callable[[], bool],
    ) -> None:
        self.ctx = ctx
        self.engine = engine
        self.pool = pool
        self.gens = generations
        self.incidents = incidents
        self.inprocess = inprocess
        self.hotswitch = hotswitch
        self.elastic = elastic
        self._finish = finish
        self.finished = finished
        self.policy_state: JobState = Running()
        #: The policy generation of the rung being carried out: outcome events name it, so
        #: the policy can tell a stale outcome (of a rung given up) from a current one.
        self._rung: int | None = None
        self._queue: list[PolicyEvent] = []
        self._deciding = False
        #: Commands held back by a ``BackOff`` (a fault recurred without progress) or a device
        #: reset: when they are due, and what they are. A newer rung's decision replaces them.
        self.held: tuple[float, tuple[Command, ...]] | None = None
        #: Link failover between network planes (unbroken.spec.knobs.FaultHandling.
        #: link_failover): every rank regroups over another plane in its own process
        #: (unbroken.manager.planes), when the active plane fails or is slow.
        self.planes = PlaneSwitcher(
            PlaneConfig(enabled=ctx.fh.link_failover),
            ctx.ledger,
            ctx.console,
            busy=self._plane_switch_waits,
            cut=self._cut_plane,
            begin=self.rejoin_in_place,
            ranks=lambda: self.gens.ranks,
        )
        engine.start_plane = self.planes.start_plane

    # ---- the policy -------------------------------------------------------------------
    def policy(self, event: PolicyEvent, now: float) -> None:
        """Feed an event to the policy and carry out its commands (iteratively: a command
        that fails feeds a new event, handled after the current decision's commands)."""
        if isinstance(event, FaultReported) and self._plane_takes(event.fault, now):
            return
        if isinstance(event, RungSucceeded):  # ranks without a session commit no first step
            self.inprocess.label.committed(self.gens.current, event.at)
        self._queue.append(event)
        if self._deciding:
            return
        self._deciding = True
        try:
            self._decide_queued(now)
        finally:
            self._deciding = False

    def _decide_queued(self, now: float) -> None:
        ctx = self.ctx
        while self._queue and not self.finished():
            ev = self._queue.pop(0)
            before = self.policy_state
            d = decide(before, ev, ctx.fh, now)
            self.policy_state = d.state
            self._rung = d.state.generation if isinstance(d.state, Recovering) else None
            pr = self.inprocess.pending_rejoin
            if pr is not None and self.stale(pr.rung):
                # The rung that paused the ranks was given up: its rejoin must not go out
                # beside what the new rung does. (Last words under way are kept: the new
                # decision's commands wait for them, see _run.)
                ctx.console.line("the rejoin under way is dropped: its rung was given up")
                self.inprocess.drop_rejoin()
            if self.held is not None and _new_rung(before, d.state):
                self.held = None  # the commands held back were for a rung given up
            self.hotswitch.given_up(before, d.state, d.reason)
            if not d.commands and not _sub_health_answered(before, ev):
                continue
            strategy = str(d.state.rung) if isinstance(d.state, Recovering) else "none"
            self.incidents.carried_out_by(strategy)
            ctx.ledger.record(
                DecisionMade(
                    fault_id=self.incidents.fault_id,
                    strategy=strategy,
                    commands=tuple(repr(c) for c in d.commands),
                    reason=d.reason,
                )
            )
            wait = ""
            if isinstance(d.state, Recovering) and d.state.deadline_at > now:
                wait = (
                    f"; {strategy} has {d.state.deadline_at - now:.0f} s to commit a step, "
                    "then the next rung is tried"
                )
            ctx.console.line(f"decision: {strategy}: {d.reason}{wait}")
            self._run(d.commands, now)
        if (
            isinstance(self.policy_state, Running)
            and self.incidents.open is not None
            and self.planes.switch is None  # a failover's incident ends with its first step
        ):
            # The fault needed no recovery (recorded, ignored, or a hot switch not possible or
            # given up): training goes on and no incident is open.
            self.incidents.dismiss()

    def rejoin_in_place(self, now: float) -> None:
        """Every rank, stopped or stopping at a step boundary, rejoins a new generation in its
        own process with its own state (after an online stress test that found nothing, or
        over another network plane)."""
        self._absorb([self.inprocess.rejoin(replace={}, now=now, rung=self._rung)], now)

    def _plane_takes(self, fault: Fault, now: float) -> bool:
        """Whether a collective's failure is the active plane's, failed over from (the
        recovery ladder does not see it)."""
        if fault.kind is not FaultKind.LINK or isinstance(self.policy_state, Recovering):
            return False
        if not self.planes.collective_failed(fault.describe(), now):
            return False
        self.incidents.carried_out_by("link-failover")
        return True

    def _terms(self) -> Terms:
        """The rung being carried out, as placements need it."""
        state = self.policy_state
        if not isinstance(state, Recovering):
            return Terms(incident_open=self.incidents.open is not None)
        return Terms(
            rung=self._rung,
            pod_level=state.rung is Rung.POD_RESCHEDULE,
            deadline_at=state.deadline_at,
            incident_open=self.incidents.open is not None,
        )

    def _absorb(self, outcomes: Sequence[Outcome | None], now: float) -> None:
        """What the parts could not do becomes the policy's next event (decided after the
        current decision's commands), or the job's end."""
        for o in outcomes:
            match o:
                case Refused(reason=reason):
                    self._queue.append(RungFailed(reason=reason, at=now, generation=self._rung))
                case NoRoom(pod=pod, at=at, may_pend=may_pend):
                    self._queue.append(
                        PodUnschedulable(pod=pod, at=at, generation=self._rung, may_pend=may_pend)
                    )
                case CannotRun(reason=reason):
                    self._finish(False, reason)
                case None:
                    pass

    def _run(self, commands: Sequence[Command], now: float) -> None:
        """Carry out ``commands`` in order. Last words being written hold back the commands
        after them (the newest decision's, when another came meanwhile) until they are
        done or have failed: a stop must not end the rank that writes them."""
        for i, cmd in enumerate(commands):
            if self.finished():
                return
            if self.inprocess.pending_dump is not None:
                self.inprocess.hold_after_dump(commands[i:])
                return
            waits = self.pool.reset_wait(cmd)
            if waits is not None:
                until, what = waits
                self.held = (until, tuple(commands[i:]))
                self.ctx.console.line(
                    f"{type(cmd).__name__} waits {until - now:.1f} s for the reset of {what} "
                    "(hotReset=2: a device is reset before it is used again)"
                )
                return
            if isinstance(cmd, RecoverOnSpare):
                # The pods of one decision move together: one placement, one rejoin.
                if not any(isinstance(c, RecoverOnSpare) for c in commands[:i]):
                    moved = [c for c in commands[i:] if isinstance(c, RecoverOnSpare)]
                    self._absorb([self.inprocess.recover_on_spare(moved, now, self._rung)], now)
                continue
            if isinstance(cmd, BackOff):
                self.held = (now + cmd.delay_s, tuple(commands[i + 1 :]))
                # The ranks hear at once that their orders come later: stopped ranks then
                # wait past their decision wait (MINDIO_WAIT_MINDX_TIME) for them.
                self.engine.pause_all()
                self.ctx.console.line(
                    f"backing off {cmd.delay_s:.0f} s before recovering (the fault recurred "
                    "without progress)"
                )
                return
            self.execute(cmd, now)

    def _run_later(self, commands: Sequence[Command], now: float) -> None:
        """Carry out commands held back (by a back-off or last words), then what they fed."""
        if self._deciding:
            self._run(commands, now)
            return
        self._deciding = True
        try:
            self._run(commands, now)
            self._decide_queued(now)
        finally:
            self._deciding = False

    def poll_held(self, now: float) -> None:
        """Carry out the commands a ``BackOff`` held back, once they are due."""
        if self.held is None or now < self.held[0]:
            return
        commands = self.held[1]
        self.held = None
        self._run_later(commands, now)

    def execute(self, cmd: Command, now: float) -> None:
        pool, engine, inprocess, rung = self.pool, self.engine, self.inprocess, self._rung
        match cmd:
            case IsolateDevice(node=node, device=device, level=level):
                pool.isolate_device(node, device, f"fault level {level}", level)
            case IsolateNode(node=node):
                pool.isolate_node(node, "node lost")
            case DeprioritiseNode(node=node, reason=reason):
                pool.deprioritise_node(node, reason)
            case RestartProcesses():
                self._absorb(engine.restart_in_place(self._terms()), now)
            case ReschedulePods(isolate_devices=devs, isolate_nodes=nodes):
                pool.isolate_all(devs, nodes)
                inprocess.label.rescheduling("pod-rescheduling", self.incidents.fault_id, now)
                self._absorb(engine.reschedule(cmd, self._terms()), now)
            case RescheduleJob(isolate_devices=devs, isolate_nodes=nodes):
                pool.isolate_all(devs, nodes)
                inprocess.label.rescheduling("job-rescheduling", self.incidents.fault_id, now)
                self.elastic.abandon()  # the whole job starts again
                self._absorb(engine.reschedule(cmd, self._terms()), now)
            case FailJob(reason=reason):
                self._finish(False, reason)
            case RetryOnline(ranks=ranks):
                self._absorb([inprocess.rejoin(replace={}, now=now, rung=rung, suspect=ranks)], now)
            case RestartInPlace(pod=pod, ranks=ranks):
                lost = {pod: tuple(ranks) or self.ctx.job.ranks_of(pod)}
                self._absorb([inprocess.rejoin(replace=lost, now=now, rung=rung)], now)
            case RecoverOnSpare():
                self._absorb([inprocess.recover_on_spare([cmd], now, rung)], now)
            case DumpLastWords(timeout_s=timeout_s):
                inprocess.dump(now, timeout_s, self._incident_faults(), rung)
            case HotSwitch(pod=pod, node=node, device=device):
                self._hot_switch(pod, node, device, now)
            case ScaleIn(pod=pod, wait_s=wait_s):
                fault_id = self.incidents.fault_id
                self._absorb([self.elastic.scale_in(pod, now, wait_s, rung, fault_id)], now)
            case BackOff():
                pass  # held by _run: it holds back the commands after it
            case _:
                reason = f"{type(cmd).__name__} is not carried out by the embedded executor"
                self._absorb([Refused(reason + " in this version")], now)

    def _hot_switch(self, pod: str, node: str | None, device: int | None, now: float) -> None:
        """The backup is placed while training goes on; then every rank stops at its next
        step boundary (the old pod's ranks ``leaving``), and :meth:`poll_rejoin` switches."""
        prepared = self.hotswitch.prepare(
            pod,
            node,
            device,
            now,
            recoverable=self.inprocess.recoverable(),
            fault_id=self.incidents.fault_id,
        )
        if isinstance(prepared, Refused):
            self._absorb([prepared], now)
            return
        rejoin = self.inprocess.rejoin(
            replace={},
            now=now,
            rung=self._rung,
            leaving=self.ctx.job.ranks_of(pod),
            replacement=prepared,
        )
        self._absorb([rejoin], now)

    def _incident_faults(self) -> tuple[Fault, ...]:
        faults = getattr(self.policy_state, "faults", ())
        if faults:
            return tuple(faults)
        inc = self.incidents.open
        return (inc.fault,) if inc is not None else ()

    # ---- the rungs under way, on the manager's tick ------------------------------------
    def poll_rejoin(self, now: float) -> None:
        """Once the healthy ranks stopped, the rejoin goes out: a hot switch's old pod goes,
        the new generation begins, every pod's ranks rejoin it and a replacement starts."""
        match self.inprocess.poll_rejoin(now):
            case None:
                return
            case RejoinFailed(rejoin=pr, reason=reason):
                self.policy(RungFailed(reason=reason, at=now, generation=pr.rung), now)
            case RejoinReady(rejoin=pr, source=source, step=step) as ready:
                if not ready.all_stopped:
                    self.ctx.console.line(
                        "the ranks the rejoin waited for did not stop in time; rejoining anyway"
                    )
                if pr.leaving and pr.replacement is not None:
                    self.hotswitch.switch_over(pr.replacement)
                gen = self.engine.begin_generation(pr.rung, replica_step=step)
                plane = self.planes.rejoin_plane(gen)
                if pr.leaving:
                    self.hotswitch.began(gen)
                self.inprocess.send_rejoin(ready, gen, self.elastic.world, plane)
                self.elastic.began(gen)
                if pr.replacement is not None:
                    join = JoinFrom(source=source, step=step)
                    self.inprocess.start_replacement(pr.replacement, gen, join)

    def poll_dump(self, now: float) -> None:
        """Once last words are written (or have failed), the commands after them run."""
        over = self.inprocess.poll_dump(now)
        if over is not None:
            self._run_later(over.then, now)

    def keep_spares(self, now: float) -> None:
        if self.finished():
            return
        quiet = self.incidents.open is None and not self.inprocess.busy
        self.engine.keep_spares(now, quiet)

    def retry_placement(self, now: float) -> None:
        self._absorb(self.engine.retry_placement(now, self._terms()), now)

    def poll_spare(self, now: float) -> None:
        """``recover`` pending for room (up to wait-reschedule-timeout): placed when room came."""
        self._absorb([self.inprocess.poll_spare(now, self.stale)], now)

    def poll_room(self, now: float) -> None:
        fault_id = self.incidents.fault_id
        self._absorb([self.elastic.poll_room(now, self._rung, self.stale, fault_id)], now)

    def scale_out(self, now: float) -> None:
        quiet = (
            not self.finished()
            and isinstance(self.policy_state, Running)
            and self.incidents.open is None
            and not self.inprocess.busy
            and self.hotswitch.switch is None
        )
        self._absorb([self.elastic.scale_out(now, quiet)], now)

    def start(self, pods: tuple[str, ...]) -> None:
        """The job's first placement: its pods start, or the job fails with the reason."""
        self._absorb(self.engine.place_and_start(pods, {}, self._terms()), self.ctx.clock())

    def committed(self, generation: int, first_commit_at: float, step: int) -> None:
        """Generation ``generation`` committed its first step (``step``): a plane switch or
        a change of world size it began is done."""
        self.planes.committed(generation, first_commit_at, step)
        self.elastic.committed(generation, first_commit_at, step)
        self.inprocess.label.committed(generation, first_commit_at)

    def stale(self, rung: int | None) -> bool:
        """Whether an outcome of the rung of policy generation ``rung`` is stale: the policy
        has given that rung up for another."""
        state = self.policy_state
        return rung is not None and isinstance(state, Recovering) and state.generation != rung

    def _plane_switch_waits(self) -> bool:
        """A plane switch waits for a recovery, a rejoin, last words or a hot switch."""
        return (
            isinstance(self.policy_state, Recovering)
            or self.inprocess.busy
            or self.hotswitch.switch is not None
            or self.finished()
        )

    def _cut_plane(self, plane: str) -> None:
        for p in self.engine.running():
            self.ctx.commands.send(p.pod, p.pid, CutPlane(plane))

    def busy(self) -> str:
        """What the job is doing that an online stress test must not cross ("" when
        nothing)."""
        if self.incidents.open is not None:
            return f"recovery from {self.incidents.open.fault_id} is under way"
        if self.inprocess.busy or self.hotswitch.switch is not None:
            return "the ranks are being regrouped"
        if self.engine.unplaced:
            return "pods wait to be placed"
        el = self.elastic.state
        if el.shrunk or el.scaling is not None:
            return "the job is scaled in (elastic training): not every pod runs"
        return ""


def _sub_health_answered(before: JobState, event: PolicyEvent) -> bool:
    """Whether the decision for ``event`` is shown and recorded even without commands: a
    sub-health fault while training runs (``subHealthyStrategy`` ignores it, or a hot switch is
    not possible now), so that a person sees why training goes on on that device."""
    return (
        isinstance(before, Running)
        and isinstance(event, FaultReported)
        and event.fault.level is FaultLevel.SUB_HEALTH
    )


def _new_rung(before: object, after: object) -> bool:
    """Whether the decision from ``before`` to ``after`` began another rung or ended the job."""
    if isinstance(after, Recovering):
        return not isinstance(before, Recovering) or before.generation != after.generation
    return after is not before and not isinstance(after, Running)
