"""Hot switching (``subHealthyStrategy: hotSwitch``): a pod leaves a sub-healthy device before
it fails.

While training goes on, the backup pod is placed on a free node other than the pod's own,
where a warm spare agent waits (its zygote has imported torch since the job's start); then
every rank stops at the next step boundary, the old pod is deleted, the healthy pods' ranks
rejoin the next generation in their processes and the backup's ranks take their state from one
of them. No step is lost or redone; training stands still from the pause to the first step the
new generation commits, which :class:`~unbroken.ledger.PodHotSwitched` records beside the
preparation time.

:class:`HotSwitcher` keeps the switch under way (:class:`Switch`); the rejoin itself is the
in-process one (:class:`~unbroken.manager.inprocess.InProcess`), which the executor starts with
what :meth:`HotSwitcher.prepare` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from unbroken.ledger import PodHotSwitched
from unbroken.manager.context import Context
from unbroken.manager.engine import Engine, Refused
from unbroken.manager.pool import Pool
from unbroken.manager.rungs import Newcomers
from unbroken.policy import JobState, Recovering, Rung
from unbroken.scheduler import Binding, Unschedulable, place


@dataclass(frozen=True)
class Switch:
    """A hot switch under way: ``pod`` leaves ``from_node`` (sub-healthy ``device``) for the
    backup placed at ``bindings``; decided at ``decided_at``, the ranks asked to pause at
    ``paused_at``; ``generation``: the rendezvous generation it began (None until the rejoin
    went out)."""

    fault_id: str
    pod: str
    from_node: str
    device: int | None
    bindings: tuple[Binding, ...]
    decided_at: float
    paused_at: float
    generation: int | None = None

    @property
    def to_node(self) -> str:
        return self.bindings[0].node


class HotSwitcher:
    """The hot switch under way (``switch``), from its decision to its first committed step."""

    def __init__(self, ctx: Context, engine: Engine, pool: Pool) -> None:
        self.ctx = ctx
        self.engine = engine
        self.pool = pool
        self.switch: Switch | None = None

    def prepare(
        self,
        pod: str,
        node: str | None,
        device: int | None,
        now: float,
        *,
        recoverable: bool,
        fault_id: str,
    ) -> Newcomers | Refused:
        """A hot switch, first half, while training goes on: the backup of ``pod`` is placed
        on a free node other than its own, where a warm spare agent waits. Returns the
        replacement the rejoin carries (every rank then stops at its next step boundary), or
        why the switch is refused (``recoverable``: every rank can be repaired in process)."""
        proc = self.engine.pods.get(pod)
        from_node = self.pool.cluster.node_of(pod)
        refused = ""
        if proc is None or not proc.alive or proc.lost or from_node is None:
            refused = f"pod {pod} has no running agent"
        elif not recoverable:
            refused = "a rank cannot be repaired in process, so no backup can take a replica"
        if refused:
            return Refused(f"hot switch refused: {refused}")
        assert from_node is not None
        # The backup runs beside the old pod until the switch: never on the old pod's node.
        probe = self.pool.cluster.isolate_node(from_node, "the pod being switched")
        engine = self.engine
        warm = [n for n in sorted(engine.spares) if engine.warm(n) and n != from_node]
        result = place(probe, self.pool.wanted([pod]), {pod: warm[0]} if warm else {})
        if isinstance(result, Unschedulable):
            return Refused(f"hot switch refused: no free node for the backup pod: {result.reason}")
        to_node = result.bindings[0].node
        spare = engine.spares.get(to_node)
        if engine.use_spares and (spare is None or not spare.alive):
            engine.start_spare(to_node)
            warm_note = "a spare agent started there now"
        elif spare is not None:
            warm_note = f"its warm spare agent (pid {spare.proc.pid}) waiting there"
        else:
            warm_note = "its agent starts cold at the switch (no spare agents)"
        self.switch = Switch(
            fault_id=fault_id,
            pod=pod,
            from_node=from_node,
            device=device,
            bindings=result.bindings,
            decided_at=now,
            paused_at=self.ctx.clock(),
        )
        where = f"device {device} of {node}" if device is not None and node else from_node
        self.ctx.console.line(
            f"hot switch of {pod} off sub-healthy {where}: backup on {to_node} ({warm_note}); "
            "every rank stops at its next step boundary"
        )
        return Newcomers(pod=pod, bindings=result.bindings)

    def switch_over(self, r: Newcomers) -> None:
        """Every rank stopped at a step boundary: the old pod is deleted, its sub-healthy
        device taken out of the pool, and the backup bound to its node (its agent starts with
        the rejoin)."""
        sw = self.switch
        self.engine.stop((r.pod,), None)
        if sw is not None and sw.device is not None:
            self.pool.isolate_device(sw.from_node, sw.device, "sub-healthy (hot switch)")
        self.pool.bind(r.bindings)

    def began(self, generation: int) -> None:
        """The switch's rejoin went out: it began ``generation``."""
        if self.switch is not None:
            self.switch = replace(self.switch, generation=generation)

    def given_up(self, before: JobState, after: JobState, reason: str) -> None:
        """A hot switch the policy gave up (it failed, passed its deadline, or a stopping
        fault came) is over: what follows is the new decision's."""
        sw = self.switch
        if sw is None or not (isinstance(before, Recovering) and before.rung is Rung.HOT_SWITCH):
            return
        if isinstance(after, Recovering) and after.generation == before.generation:
            return
        self.switch = None
        self.ctx.console.line(f"hot switch of {sw.pod} given up: {reason}")

    def done(self, generation: int, first_commit_at: float, step: int) -> None:
        """The generation a hot switch began committed its first step: the switch is done."""
        sw = self.switch
        if sw is None or sw.generation != generation:
            return
        self.switch = None
        prepare_s = sw.paused_at - sw.decided_at
        switch_s = first_commit_at - sw.paused_at
        self.ctx.ledger.record(
            PodHotSwitched(
                fault_id=sw.fault_id,
                pod=sw.pod,
                from_node=sw.from_node,
                to_node=sw.to_node,
                generation=generation,
                step=step,
                prepare_s=prepare_s,
                switch_s=switch_s,
            ),
            at=first_commit_at,
        )
        self.ctx.console.line(
            f"hot switch of {sw.pod} from {sw.from_node} to {sw.to_node} done: training stood "
            f"still {switch_s:.2f} s (prepared in {prepare_s:.2f} s while it went on), step "
            f"{step} committed by generation {generation}"
        )
