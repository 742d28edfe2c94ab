"""The typed events of a run: every detection, decision and phase change, as a past fact.

Each event is a frozen dataclass with a class-level ``kind`` (its class name), registered in
:data:`EVENT_TYPES` so a stored record can be turned back into the event
(:func:`unbroken.ledger.codec.decode`). Components that define their own events subclass
:class:`Event` in their own module (the kind must be unique) or write untyped records with
:meth:`unbroken.ledger.Ledger.record_raw`.

Conventions for the fields (they are what :mod:`unbroken.ledger.timeline` relies on):

- ``step`` is a count of committed optimizer steps: "step 110 committed" means the model is
  the result of 110 updates. ``StateLoaded.step`` is the step the loaded state was taken
  after, so training resumes with step ``step + 1``.
- ``generation`` is the rendezvous generation (0 for the first start, +1 per rebuild).
- ``*_at`` fields are wall-clock stamps (``time.time()``); ``*_s`` fields are durations.
- The moment an event was recorded is the record's ``at``, not a field of the event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from unbroken.spec.knobs import Strategy

#: kind -> event class, for every subclass of :class:`Event` defined so far.
EVENT_TYPES: dict[str, type[Event]] = {}

#: Kinds the control plane records without an event class (``Ledger.record_raw``).
RAW_KINDS = frozenset(
    {
        "FaultInjected",
        "LastWordsFailed",
        "OpRetry",
        "PodUnschedulable",
        "SpareStarted",
        "SpareTaken",
    }
)


@dataclass(frozen=True)
class Event:
    """Base of every ledger event. Subclasses are frozen dataclasses named as past facts."""

    kind: ClassVar[str] = "Event"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind", cls.__name__)
        if not isinstance(kind, str) or not kind:
            raise TypeError(f"{cls.__qualname__}.kind must be a non-empty string")
        known = EVENT_TYPES.get(kind)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise TypeError(
                f"event kind {kind!r} of {cls.__module__}.{cls.__qualname__} is already "
                f"used by {known.__module__}.{known.__qualname__}"
            )
        cls.kind = kind
        EVENT_TYPES[kind] = cls


class StateSource(StrEnum):
    """Where a (re)started rank's training state came from."""

    INITIAL = "initial"  # fresh initialisation, nothing to load
    CHECKPOINT = "checkpoint"  # periodic or last-words checkpoint on storage
    REPLICA = "replica"  # broadcast from a healthy replica over the new process group
    MEMORY = "memory"  # the process survived and kept its state (online recovery)


# -- the job's life ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSubmitted(Event):
    """The job was accepted and is about to be placed."""

    job: str
    pods: tuple[str, ...]
    world_size: int
    total_steps: int | None = None
    strategies: tuple[Strategy, ...] = ()
    spec_path: str = ""


@dataclass(frozen=True)
class JobSucceeded(Event):
    """Training finished: the last step committed."""

    step: int


@dataclass(frozen=True)
class JobFailed(Event):
    """The job gave up; ``reason`` is the sentence a user reads."""

    reason: str
    step: int | None = None


@dataclass(frozen=True)
class JobStopped(Event):
    """The user stopped the run (``signal``: SIGINT or SIGTERM to ``unbroken run`` or
    ``unbroken serve``) at committed ``step``; recorded once every process of the run ended."""

    signal: str
    step: int


# -- starting a generation -----------------------------------------------------------------


@dataclass(frozen=True)
class PodPlaced(Event):
    """The scheduler bound a pod to a node and some of its devices."""

    pod: str
    node: str
    devices: tuple[int, ...]
    generation: int


@dataclass(frozen=True)
class DeviceMemoryFreed(Event):
    """Before starting processes on GPUs that the processes they replace used, the pod's
    agent waited until the driver had freed those processes' device memory (``waited_s``;
    ``freed`` False: it gave up at its bound and started them anyway)."""

    pod: str
    ranks: tuple[int, ...]
    gpus: tuple[int, ...]
    waited_s: float
    freed: bool = True


@dataclass(frozen=True)
class ProcessesStarted(Event):
    """A pod's agent started (or restarted) training processes for these ranks."""

    pod: str
    node: str
    ranks: tuple[int, ...]
    pids: tuple[int, ...]
    generation: int


@dataclass(frozen=True)
class CommunicationReady(Event):
    """Every member of a generation joined its process group."""

    generation: int
    world_size: int


@dataclass(frozen=True)
class StateLoaded(Event):
    """Every rank of a generation holds consistent training state as of ``step``."""

    generation: int
    step: int
    source: StateSource
    detail: str = ""


@dataclass(frozen=True)
class FirstStepCommitted(Event):
    """The first optimizer step of a generation committed on every rank."""

    generation: int
    step: int


@dataclass(frozen=True)
class StepProgress(Event):
    """Sparse progress marker (every N committed steps). ``step_time_s`` is the ranks' median;
    ``rank_step_times_s[r]`` rank ``r``'s last step time (0: not known)."""

    generation: int
    step: int
    step_time_s: float | None = None
    rank_step_times_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class CheckpointSaved(Event):
    """A checkpoint of ``step`` became durable (its manifest was written)."""

    step: int
    path: str
    duration_s: float
    last_words: bool = False


# -- faults and recovery -------------------------------------------------------------------


@dataclass(frozen=True)
class FaultDetected(Event):
    """A detector reported a fault.

    ``occurred_at`` is the detector's best estimate of when the fault happened (the process
    exit, the last heartbeat, the device poll that saw it); the record's ``at`` is when the
    control plane learned of it. ``step`` is the job's last committed step at detection, when
    known: the incident timeline derives the recomputed steps from it.
    """

    fault_id: str
    source: str
    code: str
    level: str
    occurred_at: float
    step: int | None = None
    pods: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    detail: str = ""


@dataclass(frozen=True)
class DecisionMade(Event):
    """The policy chose how to handle a fault.

    ``strategy`` is a rung of the ladder (a ``recover-strategy`` token, ``pod-rescheduling``,
    ``job-rescheduling``, ``op-retry``, ``ignore``); ``commands`` are the policy's commands,
    rendered for people (``"RestartRanks(ranks=(3,))"``).
    """

    fault_id: str
    strategy: str
    commands: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class PodsStopped(Event):
    """These pods' processes are gone (SIGTERM within the grace period, or SIGKILL)."""

    pods: tuple[str, ...]
    graceful: bool
    generation: int


@dataclass(frozen=True)
class DeviceIsolated(Event):
    """A device was taken out of the schedulable pool."""

    node: str
    device: int
    code: str | None
    reason: str


@dataclass(frozen=True)
class NodeIsolated(Event):
    """A whole node was taken out of the schedulable pool."""

    node: str
    reason: str


@dataclass(frozen=True)
class NodeDeprioritised(Event):
    """A node reported a sub-health fault the job ignores: from now on pods are placed there
    only when no other node can take them."""

    node: str
    reason: str


@dataclass(frozen=True)
class DeviceResetStarted(Event):
    """A device whose fault level resets it is being reset (``-hotReset=2``), out of the pool
    for the reset, ``reset_s`` as the device reports it (the ``sim`` provider models it)."""

    node: str
    device: int
    code: str
    reset_s: float


@dataclass(frozen=True)
class DeviceReset(Event):
    """A device's reset is over: it reports healthy, ``took_s`` after the reset began."""

    node: str
    device: int
    took_s: float


@dataclass(frozen=True)
class DeviceReturned(Event):
    """An isolated device went back to the pool (healthy again with autoStowing, or by hand)."""

    node: str
    device: int
    reason: str


@dataclass(frozen=True)
class RungsUnavailable(Event):
    """Rungs of the recovery ladder the job cannot have, and why (said once): ``ranks`` run
    without an Unbroken session (a plain torchrun script that never calls
    ``unbroken.worker.init``), so the process-level rungs are not available (``rungs``: those
    its ``recover-strategy`` configures, empty when none) and faults fall to in-pod restarts
    and pod- and job-level rescheduling."""

    ranks: tuple[int, ...]
    rungs: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class RecoveryCompleted(Event):
    """Training committed a step after an incident; ``phases_s`` are its measured phases."""

    fault_id: str
    strategy: str
    generation: int
    step: int
    phases_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PodHotSwitched(Event):
    """``subHealthyStrategy: hotSwitch`` moved ``pod`` off a sub-healthy device of
    ``from_node`` to ``to_node``; generation ``generation`` committed ``step`` first.

    ``prepare_s``: from the decision to the pause, while training went on (the backup pod
    placed, its warm agent ready); ``switch_s``: from the pause to that first committed step,
    the only time training stood still (healthy ranks stop at a step boundary, the old pod is
    deleted, the backup's ranks take the state of a replica, every rank redoes nothing).
    """

    fault_id: str
    pod: str
    from_node: str
    to_node: str
    generation: int
    step: int
    prepare_s: float
    switch_s: float


# -- online stress tests -------------------------------------------------------------------


@dataclass(frozen=True)
class StressRankResult:
    """One rank in a stress test: its device check's code (the seed's ``aic``) and checksum,
    its links' code (``p2p``), and why a code is not 0."""

    rank: int
    pod: str
    node: str
    device: int | None
    device_code: int
    link_code: int
    checksum: str
    reason: str = ""


@dataclass(frozen=True)
class StressLinkResult:
    """One link between two ranks: its bandwidth in GB/s (the slower end's measure) and code."""

    a: int
    b: int
    gbps: float
    code: int
    reason: str = ""


@dataclass(frozen=True)
class StressTested(Event):
    """Online stress test ``round`` ran while every rank stood at a step boundary after
    ``step``: each device's compute check and each link's bandwidth, with the seed's result
    codes (0 no fault, 1 failed but training can resume, 2 fault found: isolate, 3 timed out).
    ``code``: the worst of them; ``faulty``: the ranks with a 2, handed to the recovery ladder
    as stress-test faults; ``stop_s``: from the request until every rank stood still;
    ``test_s``: the test itself."""

    round: int
    step: int
    code: int
    ranks: tuple[StressRankResult, ...]
    links: tuple[StressLinkResult, ...]
    median_gbps: float
    faulty: tuple[int, ...]
    stop_s: float
    test_s: float


@dataclass(frozen=True)
class StressTestFinished(Event):
    """Training resumed after stress test ``round``: generation ``generation`` committed
    ``step`` first. ``paused_s``: from the request to that commit, all the time training stood
    still (``stop_s`` to stop every rank at a step boundary, ``test_s`` for the checks,
    ``resume_s`` to rejoin, or to recover from what the test found, and commit a step);
    ``recovered``: a fault it found was recovered from before training resumed."""

    round: int
    generation: int
    step: int
    code: int
    paused_s: float
    stop_s: float
    test_s: float
    resume_s: float
    recovered: bool = False


# -- link failover between network planes --------------------------------------------------


@dataclass(frozen=True)
class PlaneChanged(Event):
    """Network plane ``plane`` of ``node`` went down (its interface lost carrier) or came up
    at ``changed_at``."""

    node: str
    plane: str
    up: bool
    changed_at: float


@dataclass(frozen=True)
class RungsSwitchedOff(Event):
    """The environment of ``pod`` (its ranks ``ranks``) turns ``rungs`` the job configures off
    for the whole job: ``setting`` (``PROCESS_RECOVER=off``, ``TASKD_PROCESS_ENABLE=off``,
    ``ENABLE_RESTART_FAULT_PROCESS=off``: :mod:`unbroken.manager.switches`). Said once per pod
    and setting."""

    pod: str
    ranks: tuple[int, ...]
    rungs: tuple[str, ...]
    setting: str


@dataclass(frozen=True)
class ProcessRecoverPaused(Event):
    """``process-recover-enable`` went from ``on`` to ``pause``: fault ``fault_id`` went to
    ``rescheduling`` (``pod-rescheduling``, ``job-rescheduling``), and the process-level rungs
    stay off until the rescheduled job trains again (the reference's ClusterD sets the label so
    when a fault falls to rescheduling, and back to ``on`` when the job registers again)."""

    fault_id: str
    rescheduling: str


@dataclass(frozen=True)
class ProcessRecoverResumed(Event):
    """``process-recover-enable`` is ``on`` again: generation ``generation`` committed its first
    step on every rank after the rescheduling that paused it."""

    generation: int
    paused_s: float


@dataclass(frozen=True)
class PlaneSubHealthy(Event):
    """The job's active network plane ``plane`` was found slow (sub-health, policy row P11):
    the part of each step the ranks waited on their gradients alone took ``comm_s`` against
    ``baseline_s`` on that plane, ``steps`` steps in a row."""

    plane: str
    comm_s: float
    baseline_s: float
    steps: int


@dataclass(frozen=True)
class PlaneFailover(Event):
    """Every rank regrouped in its own process over plane ``to``, leaving ``from_plane``;
    generation ``generation`` committed ``step`` first. ``planned``: an operator's command
    (at a step boundary; nothing failed); else ``from_plane`` went down and the collective
    interrupted on it is redone. ``pause_s``: from the pause to that first commit, the time
    training stood still; ``reason``: why it switched."""

    from_plane: str
    to: str
    planned: bool
    generation: int
    step: int
    pause_s: float
    reason: str


@dataclass(frozen=True)
class PlaneSwitchback(Event):
    """As :class:`PlaneFailover`, back to the preferred plane ``to`` once it was healthy on
    every node for the hold time (or on an operator's command): a planned pause at a step
    boundary."""

    from_plane: str
    to: str
    planned: bool
    generation: int
    step: int
    pause_s: float
    reason: str
