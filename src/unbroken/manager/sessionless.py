"""Training scripts without an Unbroken session: a plain torchrun script under ``unbroken run``.

A script that never calls ``unbroken.worker.init`` writes no heartbeat record: the manager sees
its processes start and exit, never a step. In-pod restarts and pod- and job-level rescheduling
need nothing more: they restart the processes, which resume from the script's own checkpoints.
The process-level rungs (``retry``, ``recover-in-place``, ``recover``, ``elastic-training``,
``dump``) need the session's heartbeat steps and a replica of the state repaired in process, so
such a job does not have them. :class:`Sessionless`:

- knows the job runs without a session once every rank of the current generation started and
  none, in this generation or an earlier one, wrote a record (:meth:`Sessionless.known`);
- says so once, at the first moment the manager acts on it (a fault decided, or every rank
  exiting 0), on the console and as a ``RungsUnavailable`` record (:meth:`Sessionless.say`,
  :meth:`Sessionless.at_fault`);
  the policy is told apart, through ``Feasibility.process_off``
  (:mod:`unbroken.manager.feasible`);
- ends a rung of such a job when every rank of the generation it began has started, the last
  thing the manager can see of a recovery (:meth:`Sessionless.restarted`);
- counts, for the rule on faults that recur without progress (:mod:`unbroken.policy.stall`),
  each generation that ran :data:`~unbroken.policy.stall.QUICK_ROUND_S` or longer before its
  fault as progress, as ``unbroken launch`` does without a control plane
  (:meth:`Sessionless.at_fault`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from unbroken.ledger import RungsUnavailable
from unbroken.manager.context import Context
from unbroken.manager.feasible import some
from unbroken.manager.generations import Generations
from unbroken.manager.incident import Incidents
from unbroken.manager.milestones import Milestones
from unbroken.policy import RungSucceeded
from unbroken.policy.stall import QUICK_ROUND_S
from unbroken.spec.knobs import STRATEGY_PRIORITY, Strategy

#: Why the process-level rungs are not available to a job without a session.
WHY = "they need the session's heartbeat steps and a replica of the state"


class Sessionless:
    """Whether the job runs without an Unbroken session, and what follows from it (see the
    module doc). ``said``: the job was found to, and it was said."""

    def __init__(
        self, ctx: Context, gens: Generations, milestones: Milestones, incidents: Incidents
    ) -> None:
        self.ctx = ctx
        self.gens = gens
        self.milestones = milestones
        self.incidents = incidents
        self.said = False
        #: A rank of the run wrote a heartbeat record once: the script has a session.
        self.seen = False
        #: Generations that ran QUICK_ROUND_S or longer before a fault, counted once each.
        self._long_rounds: set[int] = set()

    def known(self, world_size: int) -> bool:
        """Whether the job is known to run without a session now: every rank of the current
        generation started, none has a session, and no generation had one before (one that
        reached a milestone had: only a session reports them)."""
        ranks = self.gens.ranks
        self.seen = (
            self.seen or bool(self.milestones.done) or any(v.session for v in ranks.values())
        )
        return not self.seen and bool(ranks) and len(ranks) >= world_size

    @property
    def active(self) -> bool:
        """The job was said to run without a session, and none has appeared since."""
        return self.said and not self.seen

    def say(self, ranks: Sequence[int]) -> None:
        """Say, once, which rungs the job does not have and why."""
        if self.said:
            return
        self.said = True
        process_level = [s for s in STRATEGY_PRIORITY if s is not Strategy.EXIT]
        configured = tuple(str(s) for s in process_level if s in self.ctx.fh.strategies)
        who = f"rank {ranks[0]} runs" if len(ranks) == 1 else f"ranks {some(list(ranks))} run"
        missing = (
            f"the process-level rungs it configures ({', '.join(configured)}) are not available"
            if configured
            else "it has no process-level rung, and could not have one"
        )
        line = (
            f"{who} without an Unbroken session (the script does not call "
            f"unbroken.worker.init): {missing} ({WHY}); faults are recovered by restarting the "
            "processes (in-pod restart, pod- and job-level rescheduling), which resume from "
            "the script's own checkpoints"
        )
        self.ctx.ledger.record(RungsUnavailable(ranks=tuple(ranks), rungs=configured, reason=line))
        self.ctx.console.line(line)

    def at_fault(self, world_size: int, job_started_at: float, now: float) -> int | None:
        """At a fault decided at ``now``: None when the job is not known to run without a
        session; else (said, if it was not yet) its progress for the stall rule, as a count of
        generations that ran QUICK_ROUND_S or longer before a fault (it shows no step)."""
        if not self.known(world_size):
            return None
        self.say(sorted(self.gens.ranks))
        gens = self.gens
        if now - (gens.began_at(gens.current) or job_started_at) >= QUICK_ROUND_S:
            self._long_rounds.add(gens.current)
        return len(self._long_rounds)

    def restarted(
        self, world_size: int, stale: Callable[[int | None], bool]
    ) -> RungSucceeded | None:
        """A rung of a job without a session is over once every rank of the generation it
        began has started (no step of it can be seen): the incident ends, and the policy's
        event for it is returned (None while the rung goes on, or for a stale rung)."""
        gens = self.gens
        if self.incidents.open is None or not self.active or len(gens.ranks) < world_size:
            return None
        rung = gens.rung_of(gens.current)
        if stale(rung):
            return None
        at = self.ctx.clock()
        self.incidents.restarted(gens.current, at)
        return RungSucceeded(at=at, generation=rung)
