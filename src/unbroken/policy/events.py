"""Events the executor feeds to :func:`unbroken.policy.decision`: past facts.

``at`` fields are wall-clock stamps (``time.time()`` units) of when the fact happened.

Outcome events (``RungSucceeded``, ``RungFailed``, ``PodUnschedulable``,
``ReplacementReady``) name the ``generation`` of the rung they belong to, as the policy gave it
in :class:`~unbroken.policy.states.Recovering`; the job manager's executor tags each rung's work
with it. An outcome of a rung the policy has since given up is then stale and ignored (row V10
of :mod:`unbroken.policy.decision`); None: unknown, taken as current.
"""

from __future__ import annotations

from dataclasses import dataclass

from unbroken.faults import Fault
from unbroken.spec.knobs import Strategy


@dataclass(frozen=True)
class Feasibility:
    """What the job manager found feasible when it reported a fault.

    The defaults are the conservative answers (nothing process-level is possible; a pod may be
    placed again), for an executor that cannot compute a field.
    """

    replica_for_lost_state: bool = False  # a healthy data-parallel replica holds every lost
    #                                       rank's state
    outside_update: bool = False  # all ranks stopped outside the optimizer update, or in a
    #                               split the manager can repair
    spare_node_free: bool = False  # a spare node with healthy devices is free now
    fault_age_s: float = 0.0  # how old the fault was when reported
    rank0_pod_faulty: bool = False  # the fault touches the pod of rank 0
    pod_schedulable: bool = True  # the faulty pod(s) could be placed elsewhere now
    pod_may_pend: bool = False  # not now, but once isolated devices are back in the pool:
    #                             pod-level rescheduling pends for room (12 sessions at most)
    elastic_possible: bool = False  # the job can continue without the lost data-parallel replica
    elastic_off: str = ""  # why it cannot, when the manager knows (the rank-0 pod, the minimum)
    process_off: str = ""  # why no rank can be repaired in process, when the manager knows
    #: Rungs a pod's own environment turns off (PROCESS_RECOVER, ...), each with why.
    switched_off: tuple[tuple[Strategy, str], ...] = ()


@dataclass(frozen=True)
class FaultReported:
    """``progress_step``: the highest step the job has ever committed when the fault came
    (None: unknown; no stall is counted, see :mod:`unbroken.policy.stall`).

    ``together``: further faults detected in the same instant as ``fault`` (a rack's nodes
    found lost in one check): one incident with it, decided once (rows R13, V12 of
    :mod:`unbroken.policy.decision`), so that a burst is not taken for a fault that escalates
    32 times. Only faults that stop training come together; ``feasibility`` is for them all.
    """

    fault: Fault
    feasibility: Feasibility = Feasibility()
    progress_step: int | None = None
    together: tuple[Fault, ...] = ()

    def __post_init__(self) -> None:
        if self.together and not all(f.level.stops_training for f in self.faults):
            raise ValueError("only faults that stop training are detected together")

    @property
    def faults(self) -> tuple[Fault, ...]:
        """``fault`` and the faults detected with it."""
        return (self.fault, *self.together)


@dataclass(frozen=True)
class RungSucceeded:
    """All ranks committed their first step after the recovery."""

    at: float
    generation: int | None = None


@dataclass(frozen=True)
class RungFailed:
    """The rung being executed failed (replacement not placeable, repair failed, ...)."""

    reason: str
    at: float
    generation: int | None = None


@dataclass(frozen=True)
class PodUnschedulable:
    """A pod that was to be placed stayed pending (``may_pend``: room may come back, once
    isolated devices are healthy again, and the pod pends for it)."""

    pod: str
    at: float
    generation: int | None = None
    may_pend: bool = False


@dataclass(frozen=True)
class ReplacementReady:
    """The replacement pod of a ``recover`` rung is running; repair is under way."""

    pod: str
    at: float
    generation: int | None = None


@dataclass(frozen=True)
class Tick:
    """Time passed; deadlines are checked against the ``now`` given to ``decide``."""

    now: float


@dataclass(frozen=True)
class JobCompleted:
    at: float


Event = (
    FaultReported
    | RungSucceeded
    | RungFailed
    | PodUnschedulable
    | ReplacementReady
    | Tick
    | JobCompleted
)
