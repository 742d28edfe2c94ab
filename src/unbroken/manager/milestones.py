"""The milestones of a generation, read from its ranks' heartbeats: communication ready on
every rank, state loaded, the first step committed; and the job's progress every few steps.

:class:`Milestones` says which were reached since it was last asked (each once per
generation); the manager's loop records them and acts on the first commit (it ends an
incident, a hot switch, a change of world size).
"""

from __future__ import annotations

from dataclasses import dataclass

from unbroken.ledger import StateSource
from unbroken.manager.generations import Generations
from unbroken.manager.progress import PhaseWatch, median_step_time


@dataclass(frozen=True)
class CommReady:
    generation: int
    world_size: int
    at: float


@dataclass(frozen=True)
class Loaded:
    """Every rank's state loaded at ``step`` from ``source``."""

    generation: int
    step: int
    source: StateSource
    at: float


@dataclass(frozen=True)
class FirstCommit:
    """Every rank committed step ``step``, the first after resuming at ``resumed``."""

    generation: int
    step: int
    resumed: int
    at: float


@dataclass(frozen=True)
class Progress:
    """Every rank committed ``step`` (a multiple of the progress interval passed)."""

    generation: int
    step: int
    step_time_s: float
    rank_step_times_s: tuple[float, ...]


Milestone = CommReady | Loaded | FirstCommit | Progress


class Milestones:
    """What each generation reached (``done``: milestone -> the generation that reached it)."""

    def __init__(self, world_size: int, progress_every: int) -> None:
        self.world_size = world_size
        self.every = progress_every
        self.done: dict[str, int] = {}
        self.watch = PhaseWatch()
        #: The highest step every rank has committed, over the whole run.
        self.progress_step = 0

    def touch(self, rank: int) -> None:
        """``rank``'s view was replaced or updated."""
        self.watch.touch(rank)

    def reached(self, gens: Generations, world_size: int, scan: bool) -> list[Milestone]:
        """The milestones reached since the last call, in order. ``world_size``: the ranks of
        the current world (fewer while an elastic job is scaled in); ``scan``: read the
        progress too (a pass over every rank, done at the scans of a large job)."""
        gen = gens.current
        if not scan and all(self.done.get(k) == gen for k in ("comm", "state", "first")):
            return []  # the generation trains: its progress is read at the next scan
        if len(gens.ranks) < world_size:
            return []
        out: list[Milestone] = []
        ph = self.watch.phases(gens.ranks, world_size, gen, gens.began_at(gen))
        replica_step = gens.replica_step(gen)
        if ph.comm_ready_at and self.done.get("comm") != gen:
            self.done["comm"] = gen
            out.append(CommReady(gen, world_size, ph.comm_ready_at))
        if ph.state_loaded_at and self.done.get("state") != gen:
            self.done["state"] = gen
            if replica_step is not None:  # in-process recovery: state from a replica
                start, source = replica_step, StateSource.REPLICA
            else:
                start = ph.start_step if ph.start_step is not None else 0
                source = StateSource.CHECKPOINT if start > 0 else StateSource.INITIAL
            out.append(Loaded(gen, start, source, ph.state_loaded_at))
        if ph.first_commit_at and self.done.get("first") != gen:
            self.done["first"] = gen
            resumed = replica_step if replica_step is not None else ph.start_step or 0
            out.append(FirstCommit(gen, resumed + 1, resumed, ph.first_commit_at))
        if not scan:
            return out
        step = gens.committed()
        if step // self.every > self.progress_step // self.every:
            ranks = gens.ranks
            out.append(
                Progress(
                    gen,
                    step,
                    median_step_time(ranks.values()),
                    tuple(
                        ranks[r].step_time_s if r in ranks else 0.0 for r in range(self.world_size)
                    ),
                )
            )
        self.progress_step = max(self.progress_step, step)
        return out
