"""The job's recovery states: frozen values carrying their data.

Budgets travel in every state. ``generation`` counts the rungs started over the job's life (each
one is a new attempt: the executor may use it as its rendezvous generation).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from unbroken.faults import Fault
from unbroken.policy.events import Feasibility


class Rung(StrEnum):
    """A step of the recovery ladder, in the order the ladder descends."""

    RETRY = "retry"
    RECOVER_IN_PLACE = "recover-in-place"
    RECOVER = "recover"
    ELASTIC_TRAINING = "elastic-training"
    PROCESS_RESTART = "process-restart"  # in-pod restart by the agent
    POD_RESCHEDULE = "pod-rescheduling"
    JOB_RESCHEDULE = "job-rescheduling"
    HOT_SWITCH = "hot-switch"  # subHealthyStrategy=hotSwitch; not on the ladder

    @property
    def order(self) -> int:
        """Position on the ladder (lower is tried first); -1 for ``hot-switch``."""
        return -1 if self is Rung.HOT_SWITCH else _LADDER.index(self)

    @property
    def process_level(self) -> bool:
        return self in _PROCESS_LEVEL

    @property
    def reschedules(self) -> bool:
        return self in (Rung.POD_RESCHEDULE, Rung.JOB_RESCHEDULE)


_LADDER = (
    Rung.RETRY,
    Rung.RECOVER_IN_PLACE,
    Rung.RECOVER,
    Rung.ELASTIC_TRAINING,
    Rung.PROCESS_RESTART,
    Rung.POD_RESCHEDULE,
    Rung.JOB_RESCHEDULE,
)
_PROCESS_LEVEL = frozenset(_LADDER[:4])


@dataclass(frozen=True)
class Budgets:
    """What has been spent.

    ``restarts``: in-pod restarts per pod since that pod was last (re)placed, sorted by pod
    (bounded by ``max_restarts``). ``software_reschedules``: reschedules for software faults
    over the job's life (bounded by ``fault_retry_times``). ``hardware_reschedules``:
    reschedules for hardware faults since the last recovery that committed a step (bounded by
    :data:`~unbroken.policy.ladder.HARDWARE_RESCHEDULE_CAP`). ``progress_mark``: the highest
    committed step the job had reached at the last stopping fault; ``stalls``: stopping faults
    in a row that found the job no further than that (:mod:`unbroken.policy.stall`; bounded by
    ``no_progress_restarts``); ``round_at``: when the rung for the last counted one began
    (its decision plus its backoff; faults stamped earlier belong to that round).
    """

    restarts: tuple[tuple[str, int], ...] = ()
    software_reschedules: int = 0
    hardware_reschedules: int = 0
    progress_mark: int = -1
    stalls: int = 0
    round_at: float = 0.0

    def restarts_of(self, pod: str) -> int:
        return dict(self.restarts).get(pod, 0)

    def with_restarts(self, pods: tuple[str, ...]) -> Budgets:
        counts = dict(self.restarts)
        for pod in pods:
            counts[pod] = counts.get(pod, 0) + 1
        return dataclasses.replace(self, restarts=tuple(sorted(counts.items())))

    def with_placed(self, pods: tuple[str, ...] | None) -> Budgets:
        """Budgets after ``pods`` (every pod when None) were placed anew: their agents start
        with fresh restart counts."""
        if pods is None:
            return dataclasses.replace(self, restarts=())
        kept = tuple((pod, n) for pod, n in self.restarts if pod not in pods)
        return dataclasses.replace(self, restarts=kept)


@dataclass(frozen=True)
class Running:
    generation: int = 0
    budgets: Budgets = Budgets()


@dataclass(frozen=True)
class Recovering:
    """A rung is being executed for the faults of one incident.

    ``faults``: the incident's faults (a fault during recovery joins them). ``feasibility``:
    the latest the manager reported. ``incident_at``: when the incident's first decision was
    made; ``rung_at``: when this rung was decided. ``deadline_at``: when the rung counts as
    failed. ``remaining``: the rungs planned
    after this one (re-planned on failure, since budgets and feasibility change).
    ``dumped``: last words were already saved in this incident.
    """

    generation: int
    budgets: Budgets
    faults: tuple[Fault, ...]
    feasibility: Feasibility
    rung: Rung
    incident_at: float
    rung_at: float
    deadline_at: float
    remaining: tuple[Rung, ...] = ()
    dumped: bool = False


@dataclass(frozen=True)
class Failed:
    generation: int
    budgets: Budgets
    reason: str
    at: float


@dataclass(frozen=True)
class Succeeded:
    generation: int
    budgets: Budgets
    at: float


JobState = Running | Recovering | Failed | Succeeded
