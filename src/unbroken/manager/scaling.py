"""Elastic training carried out: scale in without a lost pod, wait for room, scale out.

``elastic-training`` drops a lost pod that cannot be replaced (after it pended up to
``wait-reschedule-timeout`` for room, when ``recover`` is configured too): the other pods' ranks
stop at a step boundary and rejoin the next generation in their processes at the smaller world
size. Once room is back for every dropped pod and nothing else is under way, they are placed and
the job scales out at a step boundary, the newcomers repaired from a replica.

:class:`Elastic` owns the pure :class:`~unbroken.manager.elastic.ElasticState` and the pods
pending for room; the regroup is the in-process rejoin
(:class:`~unbroken.manager.inprocess.InProcess`). What it cannot do is returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from unbroken.faults import Fault
from unbroken.manager.context import Context
from unbroken.manager.elastic import ElasticState
from unbroken.manager.engine import Engine, Refused
from unbroken.manager.inprocess import InProcess
from unbroken.manager.pool import Pool
from unbroken.manager.rungs import Newcomers
from unbroken.scheduler import Unschedulable
from unbroken.spec.knobs import Strategy


class Elastic:
    """The job's elastic state (``state``) and the pods of a scale-in that first wait for
    room (``pending_room``: the pods, until when, and the rung that waits)."""

    def __init__(self, ctx: Context, engine: Engine, pool: Pool, inprocess: InProcess) -> None:
        self.ctx = ctx
        self.engine = engine
        self.pool = pool
        self.inprocess = inprocess
        job = ctx.job
        self.state = ElasticState(job, job.min_pods if job.min_pods is not None else len(job.pods))
        self.pending_room: tuple[tuple[str, ...], float, int | None] | None = None
        self._drop_nodes: dict[str, str] = {}
        self._scale_out_checked_at = 0.0

    @property
    def world_size(self) -> int:
        """Ranks in the current world (fewer than the job's while it is scaled in)."""
        return self.state.world_size

    @property
    def world(self) -> tuple[int, ...]:
        """The ranks of the current world when the job is scaled in, else empty (a rejoin
        then keeps the job's numbering)."""
        return self.state.world if self.state.shrunk else ()

    def refusal(self, faults: Sequence[Fault]) -> str | None:
        """Why the job cannot scale in without the faults' pods (None: it can)."""
        return self.state.refusal(tuple(dict.fromkeys(f.pod for f in faults if f.pod)))

    def abandon(self) -> None:
        """The whole job starts again (job-level rescheduling)."""
        self.state = self.state.abandoned()

    def began(self, generation: int) -> None:
        """A rejoin went out as ``generation``: a change of world size it carries began."""
        self.state = self.state.began(generation)

    def scale_in(
        self, pod: str, now: float, wait_s: float, rung: int | None, fault_id: str
    ) -> Refused | None:
        """``elastic-training``: the lost pod leaves the world; the other pods' ranks stop at
        a step boundary and rejoin the next generation in their processes at the smaller
        world size. With ``wait_s``, the pod first pends that long for room
        (:meth:`poll_room`)."""
        refusal = self.state.refusal((pod,))
        if refusal is not None:
            return Refused(f"cannot scale in: {refusal}")
        running = self.engine.pods.get(pod)
        node = running.node if running is not None else ""
        if wait_s > 0:
            self.engine.stop((pod,), None)
            pending = self.pending_room
            pods = (*pending[0], pod) if pending is not None else (pod,)
            self.pending_room = (pods, now + wait_s, rung)
            self._drop_nodes[pod] = node
            self.engine.pause_all(pods)  # until the pod is placed or dropped
            self.ctx.console.line(
                f"no room to place {pod}: it pends up to {wait_s:.0f} s "
                "(wait-reschedule-timeout) for a node before the job scales in without it"
            )
            return None
        if Strategy.RECOVER in self.ctx.job.fault_handling.strategies:
            why = "recover could not replace it"
        else:
            why = "elastic-training without recover: a lost pod is not replaced"
        return self._drop(pod, node, now, rung, fault_id, why)

    def poll_room(
        self, now: float, rung: int | None, stale: Callable[[int | None], bool], fault_id: str
    ) -> Refused | None:
        """Pods pending before a scale-in: placed and recovered when room came, dropped
        when their wait is over."""
        if self.pending_room is None:
            return None
        pods, until, waiting = self.pending_room
        if stale(waiting):
            self.pending_room = None
            return None
        result = self.pool.place(pods, self.engine.warm_nodes(pods))
        console = self.ctx.console
        if not isinstance(result, Unschedulable):
            self.pending_room = None
            self.pool.bind(result.bindings)
            console.line(
                f"room for {', '.join(pods)} within wait-reschedule-timeout: recovered on "
                f"{', '.join(b.node for b in result.bindings)} instead of scaling in"
            )
            lost = tuple(sorted(r for p in pods for r in self.ctx.job.ranks_of(p)))
            return self.inprocess.rejoin(
                replace={},
                now=now,
                rung=rung,
                suspect=lost,
                replacement=Newcomers(pod=pods[0], bindings=result.bindings),
            )
        if now < until:
            return None
        self.pending_room = None
        console.line(f"no room for {', '.join(pods)} within wait-reschedule-timeout: scaling in")
        why = "no node to place it on within wait-reschedule-timeout"
        refused = [
            self._drop(pod, self._drop_nodes.pop(pod, ""), now, rung, fault_id, why) for pod in pods
        ]
        return next((r for r in refused if r is not None), None)

    def _drop(
        self, pod: str, node: str, now: float, rung: int | None, fault_id: str, why: str
    ) -> Refused | None:
        before = self.state.world_size
        self.engine.stop((pod,), None)
        self.state = self.state.drop(pod, node, now, fault_id)
        self.ctx.console.line(
            f"scaling in: {pod} dropped ({why}); world size {before} -> "
            f"{self.state.world_size} (minimum {self.state.min_pods} pod(s)); scales out "
            "when a node is free again"
        )
        lost = frozenset(self.ctx.job.ranks_of(pod))
        if self.inprocess.also_lost(rung, lost):  # another pod of the same decision
            return None
        return self.inprocess.rejoin(replace={}, now=now, rung=rung, suspect=tuple(sorted(lost)))

    def scale_out(self, now: float, quiet: bool) -> Refused | None:
        """Once room is back for every dropped pod and nothing else is under way (``quiet``),
        place them and scale out at a step boundary: every rank pauses, the world's ranks
        rejoin the next generation at the full size and the new pods' ranks take a replica's
        state."""
        if (
            not self.state.shrunk
            or now < self._scale_out_checked_at
            or not quiet
            or self.state.scaling is not None
        ):
            return None
        self._scale_out_checked_at = now + 0.5
        engine = self.engine
        pods = self.state.dropped_pods
        result = self.pool.place(pods, engine.warm_nodes(pods))
        if isinstance(result, Unschedulable):
            return None
        cold = [b.node for b in result.bindings if engine.use_spares and not engine.warm(b.node)]
        if cold:
            # Training goes on while a spare agent (forked from the node image, torch already
            # imported) starts there: the ranks then pause only for the newcomers to join.
            for node in cold:
                engine.start_spare(node)
            self._scale_out_checked_at = now + 1.0
            return None
        self.pool.bind(result.bindings)
        before = self.state.world_size
        self.state = self.state.restore(now)
        self.ctx.console.line(
            f"scaling out: room for {', '.join(pods)} "
            f"({', '.join(b.node for b in result.bindings)}); world size {before} -> "
            f"{self.state.world_size} at the next step boundary"
        )
        return self.inprocess.rejoin(
            replace={},
            now=now,
            rung=None,
            replacement=Newcomers(pod=pods[0], bindings=result.bindings),
        )

    def committed(self, generation: int, first_commit_at: float, step: int) -> None:
        """Generation ``generation`` committed its first step (``step``): a change of world
        size it began is done, recorded with the time training stood still for it."""
        self.state, done = self.state.committed(generation)
        if done is None:
            return
        kind = "ScaledIn" if done.kind == "in" else "ScaledOut"
        took_s = first_commit_at - done.began_at
        self.ctx.ledger.record_raw(
            kind,
            {
                "fault_id": done.fault_id,
                "pods": list(done.pods),
                "from_world_size": done.from_size,
                "world_size": done.to_size,
                "generation": generation,
                "step": step,
                "took_s": took_s,
            },
            at=first_commit_at,
        )
        self.ctx.console.line(
            f"scaled {done.kind} to world size {done.to_size} (from {done.from_size}): "
            f"step {step} committed by generation {generation}, {took_s:.2f} s after the "
            + ("decision" if done.kind == "in" else "new pod was placed")
        )

    def scaled_in_message(self) -> str:
        """What the status says while the job is scaled in ("" when it is not)."""
        el = self.state
        if not el.shrunk:
            return ""
        return (
            f"scaled in: world size {el.world_size} of {self.ctx.job.world_size} "
            f"({', '.join(el.dropped_pods)} dropped); scales out when a node is free"
        )
