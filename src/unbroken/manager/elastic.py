"""Elastic training's bookkeeping: which pods the job dropped, and the world that is left.

``elastic-training`` scales a job in when a lost pod cannot be replaced: the surviving pods'
ranks regroup in their processes at the smaller world size, numbered anew in the job's rank
order (the ``world`` a rejoin carries, :class:`~unbroken.protocol.messages.RejoinRanks`).
When room comes back (a node returned, a device healthy again) the dropped pods are placed
again and the job scales out at a step boundary, the newcomers repaired from a replica. The
rank-0 pod is never dropped, and the job never goes below its minimum (``minReplicas``).

Everything here is pure: the elastic operations (:mod:`unbroken.manager.scaling`) keep one
:class:`ElasticState` and ask it; time is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from unbroken.manager.layout import JobLayout


@dataclass(frozen=True)
class Dropped:
    """A pod the job scaled in without: when, from which node."""

    pod: str
    node: str
    at: float


@dataclass(frozen=True)
class Scaling:
    """A change of world size under way, from its decision to its first committed step."""

    kind: str  # "in" or "out"
    pods: tuple[str, ...]
    from_size: int
    to_size: int
    began_at: float
    fault_id: str = ""
    generation: int | None = None  # the rendezvous generation it began, once known


@dataclass(frozen=True)
class ElasticState:
    job: JobLayout
    min_pods: int
    dropped: tuple[Dropped, ...] = ()
    scaling: Scaling | None = None
    history: tuple[Scaling, ...] = field(default=())

    @property
    def dropped_pods(self) -> tuple[str, ...]:
        return tuple(d.pod for d in self.dropped)

    @property
    def pods(self) -> tuple[str, ...]:
        """The job's pods in the current world, in node-rank order."""
        gone = set(self.dropped_pods)
        return tuple(p.name for p in self.job.pods if p.name not in gone)

    @property
    def world(self) -> tuple[int, ...]:
        """The job's ranks in the current world, in order (rank ``world[i]`` is rank ``i``)."""
        return tuple(r for pod in self.pods for r in self.job.ranks_of(pod))

    @cached_property
    def world_size(self) -> int:
        # Read on every tick and report of the manager: counted once per state (a state is
        # never changed, a new one replaces it), from the pods dropped, not by listing every
        # pod or rank.
        return self.job.world_size - sum(self.job.nproc_of(d.pod) for d in self.dropped)

    @property
    def shrunk(self) -> bool:
        return bool(self.dropped)

    def refusal(self, pods: tuple[str, ...]) -> str | None:
        """Why the job cannot scale in without ``pods`` (None: it can)."""
        if not pods:
            return "the fault names no pod to drop"
        rank0 = self.job.pod_of_rank(0)
        if rank0 in pods:
            return f"{rank0} holds rank 0 and is never dropped"
        unknown = [p for p in pods if p not in self.pods]
        if unknown:
            return f"{', '.join(unknown)} is not in the current world"
        left = len(self.pods) - len(set(pods))
        if left < self.min_pods:
            return (
                f"{left} pod(s) would be left, below the job's minimum of {self.min_pods} "
                "(minReplicas)"
            )
        return None

    def drop(self, pod: str, node: str, now: float, fault_id: str) -> ElasticState:
        """``pod`` leaves the world (a scale-in begins, or grows when one is under way)."""
        before = self.world_size
        state = replace(self, dropped=(*self.dropped, Dropped(pod, node, now)))
        sc = self.scaling
        if sc is not None and sc.kind == "in" and sc.generation is None:
            sc = replace(sc, pods=(*sc.pods, pod), to_size=state.world_size)
        else:
            sc = Scaling("in", (pod,), before, state.world_size, now, fault_id)
        return replace(state, scaling=sc)

    def restore(self, now: float) -> ElasticState:
        """Every dropped pod back in the world (a scale-out begins)."""
        pods = self.dropped_pods
        sc = Scaling("out", pods, self.world_size, self.job.world_size, now)
        return replace(self, dropped=(), scaling=sc)

    def began(self, generation: int) -> ElasticState:
        """The change under way went out as rendezvous ``generation``."""
        if self.scaling is None or self.scaling.generation is not None:
            return self
        return replace(self, scaling=replace(self.scaling, generation=generation))

    def committed(self, generation: int) -> tuple[ElasticState, Scaling | None]:
        """Generation ``generation`` committed its first step: the change it began is done."""
        sc = self.scaling
        if sc is None or sc.generation != generation:
            return self, None
        return replace(self, scaling=None, history=(*self.history, sc)), sc

    def abandoned(self) -> ElasticState:
        """The job restarts whole (job-level rescheduling): every pod is back, nothing pends."""
        return replace(self, dropped=(), scaling=None)
