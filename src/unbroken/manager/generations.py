"""The rendezvous generations of a run and the ranks of the current one: one owner.

Every restart or regroup is a new *generation*: the ranks join the process group under its own
store, and the reports of an older generation are echoes of a fault already handled. This
module keeps the counter, when each generation began, which began from a replica (and at which
step), which rung of the policy began it, and the ranks as their heartbeats show them. The
engine begins a generation (it opens the generation's store, :meth:`Engine.begin_generation
<unbroken.manager.engine.Engine.begin_generation>`); everyone else reads.
"""

from __future__ import annotations

from collections.abc import Mapping

from unbroken.manager.progress import RankView, committed_step


class Generations:
    """``current``: the generation the ranks train in (0: the job's start); ``ranks``: its
    ranks by rank, rebuilt as each pod's ranks start or rejoin."""

    def __init__(self) -> None:
        self.current = 0
        self.ranks: dict[int, RankView] = {}
        self._began_at: dict[int, float] = {}
        self._replica_step: dict[int, int] = {}
        self._rung_of: dict[int, int | None] = {}
        #: The generation whose replicas were found diverged (unbroken.worker.agreement).
        self._diverged: int | None = None
        #: Last words heard from ranks of an ended generation, (rank, when written).
        self.heard: set[tuple[int, float]] = set()
        #: Generations begun when the one before had its last words written.
        self._last_words_before: set[int] = set()

    def last_words_written(self) -> bool:
        """Whether a rank of the current generation wrote last words of the step every rank
        committed (its heartbeat said so)."""
        views = self.ranks.values()
        if not views:  # begun, none of its ranks heard yet: as the generation before it
            return self.current in self._last_words_before
        committed = min((v.committed for v in views), default=0)
        since = self.began_at(self.current)
        return any(v.dumped_at > since and v.dumped_step >= committed for v in views)

    def begin(self, now: float, rung: int | None, replica_step: int | None) -> int:
        """The next generation, begun at ``now`` by the rung of policy generation ``rung``;
        ``replica_step``: its ranks resume at that step from a replica."""
        written = self.last_words_written()
        self.current += 1
        self._began_at[self.current] = now
        if written:
            self._last_words_before.add(self.current)
        if replica_step is not None:
            self._replica_step[self.current] = replica_step
        self._rung_of[self.current] = rung
        self.ranks = {}
        return self.current

    def carry_over(self, pids: Mapping[int, int]) -> None:
        """Ranks that keep their processes into the current generation (a rejoin that starts
        none on their pod, which its agent does not announce): their views start afresh, as
        the agent's ``RanksRejoined`` would make them; their heartbeats fill them in."""
        gen = self.current
        for rank, pid in pids.items():
            self.ranks[rank] = RankView(rank=rank, pid=pid, generation=gen)

    def began_at(self, generation: int) -> float:
        """When ``generation`` began (0.0 for the job's start)."""
        return self._began_at.get(generation, 0.0)

    def replica_step(self, generation: int) -> int | None:
        """The step ``generation``'s ranks resumed at from a replica (None: not from one)."""
        return self._replica_step.get(generation)

    def rung_of(self, generation: int) -> int | None:
        """The policy generation of the rung that began rendezvous ``generation`` (None: the
        job's start, or no rung): the generation its outcome events carry."""
        return self._rung_of.get(generation)

    def mark_diverged(self) -> None:
        """The agreement check found the current generation's replicas apart."""
        self._diverged = self.current

    @property
    def diverged(self) -> bool:
        """Whether the current generation's replicas were found apart: none is a replica."""
        return self._diverged == self.current

    def committed(self, default: int = 0) -> int:
        """The step every rank of the current generation committed (``default``: none yet)."""
        return committed_step(self.ranks.values()) if self.ranks else default
