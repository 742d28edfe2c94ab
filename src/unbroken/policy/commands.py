"""Commands the decision hands to the executor: imperatives.

A :class:`~unbroken.policy.decision.Decision` carries its commands as an ordered tuple: the
executor carries them out in that order, each finished (or failed and reported) before the next
starts. A failed ``DumpLastWords`` does not stop the commands after it (the periodic checkpoint
is still there). A new decision's commands supersede the unfinished work of the previous rung
(a ``ScaleIn`` after a ``RecoverOnSpare`` timed out means: stop waiting for the replacement).

``grace_s`` is None for a forced stop (SIGKILL at once) and the seconds between SIGTERM and
SIGKILL otherwise. ``ranks == ()`` means every rank of the pod.
"""

from __future__ import annotations

from dataclasses import dataclass

from unbroken.faults import FaultLevel


@dataclass(frozen=True)
class DeviceRef:
    node: str
    device: int


@dataclass(frozen=True)
class RestartProcesses:
    """In-pod restart by the pod's agent from the latest checkpoint (counts against
    ``max_restarts`` of the pod)."""

    pod: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class ReschedulePods:
    """Pod-level rescheduling: stop only ``pods``, place them again avoiding the isolated
    devices and nodes; the other pods restart their ranks in place; resume from checkpoint."""

    pods: tuple[str, ...]
    isolate_devices: tuple[DeviceRef, ...]
    isolate_nodes: tuple[str, ...]
    grace_s: float | None


@dataclass(frozen=True)
class RescheduleJob:
    """Job-level rescheduling: stop every pod, place the job again avoiding the isolated
    devices and nodes, resume from checkpoint."""

    isolate_devices: tuple[DeviceRef, ...]
    isolate_nodes: tuple[str, ...]
    grace_s: float | None


@dataclass(frozen=True)
class IsolateDevice:
    """Place no new work on the device. ``ManuallySeparate`` needs an operator to release it;
    other levels return with the device's health (autoStowing)."""

    node: str
    device: int
    level: FaultLevel


@dataclass(frozen=True)
class IsolateNode:
    node: str


@dataclass(frozen=True)
class DeprioritiseNode:
    """``subHealthyStrategy: ignore``: training goes on, and later placements put a pod on
    ``node`` only when no other node can take it, for the rest of the run."""

    node: str
    reason: str


@dataclass(frozen=True)
class RetryOnline:
    """``retry``: no process restarts; stop, rebuild communication, repair ``ranks`` from a
    replica, redo the interrupted step."""

    ranks: tuple[int, ...]


@dataclass(frozen=True)
class RestartInPlace:
    """``recover-in-place``: restart only the faulty ranks of ``pod`` on their node; healthy
    ranks wait; repair from a replica."""

    pod: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class RecoverOnSpare:
    """``recover``: a replacement for ``pod`` on a healthy node (a spare when free); healthy
    processes wait; the replacement's ranks are repaired from a replica."""

    pod: str
    ranks: tuple[int, ...]
    isolate_devices: tuple[DeviceRef, ...]
    isolate_nodes: tuple[str, ...]


@dataclass(frozen=True)
class ScaleIn:
    """``elastic-training``: continue without ``pod``'s data-parallel replica; first wait up
    to ``wait_s`` for room to place it again (``recover`` was skipped for want of room), and
    recover it if room comes."""

    pod: str
    ranks: tuple[int, ...]
    wait_s: float = 0.0


@dataclass(frozen=True)
class DumpLastWords:
    """``dump``: a healthy replica saves the interrupted step's state (at most one step lost)."""

    timeout_s: float


@dataclass(frozen=True)
class HotSwitch:
    """``hotSwitch``: start a backup of ``pod`` on a spare node, pause at a step boundary,
    migrate its ranks (state from a replica), delete the old pod."""

    pod: str
    node: str | None
    device: int | None


@dataclass(frozen=True)
class FailJob:
    reason: str


@dataclass(frozen=True)
class BackOff:
    """Hold the commands after this one for ``delay_s``: the fault recurred without progress
    (:mod:`unbroken.policy.stall`)."""

    delay_s: float


Command = (
    RestartProcesses
    | ReschedulePods
    | RescheduleJob
    | IsolateDevice
    | IsolateNode
    | DeprioritiseNode
    | RetryOnline
    | RestartInPlace
    | RecoverOnSpare
    | ScaleIn
    | DumpLastWords
    | HotSwitch
    | FailJob
    | BackOff
)
