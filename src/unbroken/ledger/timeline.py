"""Incident timelines: where the time of each recovery went, computed from the ledger.

An incident starts at a :class:`FaultDetected` while no incident is open and ends at the next
:class:`RecoveryCompleted` (recovered) or :class:`JobFailed` (failed), or at a
:class:`DecisionMade` that starts no recovery and fails nothing (strategy ``none``: a sub-health
fault ignored or not hot-switchable, a device only taken out of the pool): training went on;
faults detected while it is open join it. Its phases, in order, each measured from the end of
the previous phase that was recorded (so the recorded phases add up to the MTTR):

==============  ==========================================================================
detect          fault occurred (``FaultDetected.occurred_at``) -> fault recorded
decide          -> first ``DecisionMade``
last_words      -> ``CheckpointSaved`` of the last words (``dump``)
stop            -> last ``PodsStopped``
place           -> last ``PodPlaced``
device_memory   -> last ``DeviceMemoryFreed`` (a GPU's memory of the processes replaced)
processes       -> last ``ProcessesStarted``
communication   -> last ``CommunicationReady``
state           -> last ``StateLoaded``
first_step      -> last ``FirstStepCommitted``
==============  ==========================================================================

A phase the strategy does not need (online recovery stops and places nothing) has no duration.
MTTR is fault occurred -> first committed step. Steps recomputed are the job's last committed
step at detection (``FaultDetected.step``) minus the step the state was loaded at.
Pure: records in, values out.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from unbroken.ledger.events import (
    CheckpointSaved,
    CommunicationReady,
    DecisionMade,
    DeviceMemoryFreed,
    FaultDetected,
    FirstStepCommitted,
    JobFailed,
    PodPlaced,
    PodsStopped,
    ProcessesStarted,
    RecoveryCompleted,
    StateLoaded,
)
from unbroken.ledger.store import Record

#: Phase names in order (see the module doc).
PHASES: tuple[str, ...] = (
    "detect",
    "decide",
    "last_words",
    "stop",
    "place",
    "device_memory",
    "processes",
    "communication",
    "state",
    "first_step",
)

# kind -> phase it ends; each keeps the last record of its kind (decide keeps the first).
_PHASE_OF_KIND: dict[str, str] = {
    PodsStopped.kind: "stop",
    PodPlaced.kind: "place",
    DeviceMemoryFreed.kind: "device_memory",
    ProcessesStarted.kind: "processes",
    CommunicationReady.kind: "communication",
    StateLoaded.kind: "state",
    FirstStepCommitted.kind: "first_step",
}


class IncidentOutcome(StrEnum):
    RECOVERED = "recovered"
    FAILED = "failed"
    OPEN = "open"  # still being handled when the records end
    WENT_ON = "went on"  # nothing to recover: training went on (a decision with strategy none)


@dataclass(frozen=True)
class PhaseSpan:
    """One phase of an incident: when it ended and how long it took (None: not recorded)."""

    name: str
    ended_at: float | None
    duration_s: float | None


@dataclass(frozen=True)
class IncidentTimeline:
    fault_id: str
    source: str
    code: str
    fault_at: float
    detected_at: float
    faults: tuple[str, ...]  # every fault id that joined, the first one included
    strategy: str | None  # of the last decision
    outcome: IncidentOutcome
    phases: tuple[PhaseSpan, ...]
    mttr_s: float | None
    steps_recomputed: int | None
    ended_at: float | None
    reason: str = ""  # why the job failed, for a failed incident

    def duration_s(self, phase: str) -> float | None:
        for p in self.phases:
            if p.name == phase:
                return p.duration_s
        raise KeyError(f"no phase {phase!r}; phases are {', '.join(PHASES)}")


@dataclass
class _Open:
    first: Record
    faults: list[str]
    strategy: str | None = None
    ends: dict[str, float] = field(default_factory=dict)
    loaded_step: int | None = None


def incidents(records: Iterable[Record]) -> tuple[IncidentTimeline, ...]:
    """The incidents in ``records`` (any order; they are sorted by id), oldest first."""
    done: list[IncidentTimeline] = []
    cur: _Open | None = None
    for rec in sorted(records, key=lambda r: r.id):
        kind = rec.kind
        if kind == FaultDetected.kind:
            fault_id = str(rec.data.get("fault_id", ""))
            if cur is None:
                cur = _Open(first=rec, faults=[fault_id])
            else:
                cur.faults.append(fault_id)
            continue
        if cur is None:
            continue
        if kind == DecisionMade.kind:
            cur.ends.setdefault("decide", rec.at)
            cur.strategy = str(rec.data.get("strategy", ""))
            commands = rec.data.get("commands") or ()
            if cur.strategy == "none" and not any(str(c).startswith("FailJob") for c in commands):
                done.append(_close(cur, IncidentOutcome.WENT_ON, rec.at, ""))
                cur = None
        elif kind == CheckpointSaved.kind:
            if rec.data.get("last_words"):
                cur.ends["last_words"] = rec.at
        elif kind in _PHASE_OF_KIND:
            cur.ends[_PHASE_OF_KIND[kind]] = rec.at
            if kind == StateLoaded.kind:
                cur.loaded_step = _int_or_none(rec.data.get("step"))
        elif kind == RecoveryCompleted.kind:
            done.append(_close(cur, IncidentOutcome.RECOVERED, rec.at, ""))
            cur = None
        elif kind == JobFailed.kind:
            done.append(_close(cur, IncidentOutcome.FAILED, rec.at, str(rec.data.get("reason"))))
            cur = None
    if cur is not None:
        done.append(_close(cur, IncidentOutcome.OPEN, None, ""))
    return tuple(done)


def _close(
    cur: _Open, outcome: IncidentOutcome, ended_at: float | None, reason: str
) -> IncidentTimeline:
    first = cur.first
    fault_at = _float_or(first.data.get("occurred_at"), first.at)
    ends = {"detect": first.at, **cur.ends}
    phases = []
    prev = fault_at
    for name in PHASES:
        end = ends.get(name)
        if end is None:
            phases.append(PhaseSpan(name, None, None))
            continue
        phases.append(PhaseSpan(name, end, max(0.0, end - prev)))
        prev = max(prev, end)
    first_step_at = ends.get("first_step")
    fault_step = _int_or_none(first.data.get("step"))
    recomputed = None
    if fault_step is not None and cur.loaded_step is not None:
        recomputed = max(0, fault_step - cur.loaded_step)
    return IncidentTimeline(
        fault_id=str(first.data.get("fault_id", "")),
        source=str(first.data.get("source", "")),
        code=str(first.data.get("code", "")),
        fault_at=fault_at,
        detected_at=first.at,
        faults=tuple(cur.faults),
        strategy=cur.strategy,
        outcome=outcome,
        phases=tuple(phases),
        mttr_s=None if first_step_at is None else max(0.0, first_step_at - fault_at),
        steps_recomputed=recomputed,
        ended_at=ended_at,
        reason=reason,
    )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or(value: Any, default: float) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return default


def format_incidents(found: Iterable[IncidentTimeline]) -> str:
    """A plain-text table per incident, for ``unbroken events --incidents`` and the benchmark."""
    blocks = []
    for number, inc in enumerate(found, start=1):
        when = datetime.datetime.fromtimestamp(inc.fault_at).strftime("%H:%M:%S.%f")[:-3]
        how = inc.strategy or "no decision"
        head = (
            f"incident {number}: {inc.source} fault {inc.code} ({inc.fault_id}) at {when}, "
            f"{inc.outcome} ({how})"
        )
        lines = [head]
        if len(inc.faults) > 1:
            lines.append(f"  faults joined: {', '.join(inc.faults[1:])}")
        for p in inc.phases:
            shown = "-" if p.duration_s is None else f"{p.duration_s:8.3f} s"
            lines.append(f"  {p.name:<14}{shown:>10}")
        mttr = "-" if inc.mttr_s is None else f"{inc.mttr_s:8.3f} s"
        lines.append(f"  {'MTTR':<14}{mttr:>10}")
        recomputed = "-" if inc.steps_recomputed is None else str(inc.steps_recomputed)
        lines.append(f"  {'recomputed':<14}{recomputed:>10} steps")
        if inc.reason:
            lines.append(f"  failed: {inc.reason}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "no incidents"
