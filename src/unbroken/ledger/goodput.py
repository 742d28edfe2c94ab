"""Goodput: where a run's wall time went, productive training or badput by cause.

The run's wall time is ``JobSubmitted`` -> ``JobSucceeded``/``JobFailed``/``JobStopped`` (or
``now`` for a run still going, or its last record for one whose control plane is gone). It is
cut into non-overlapping spans, each given to one cause:

===================  =====================================================================
startup              job submitted -> the first committed step of the first generation
detection ... first  the phases of each incident (:mod:`unbroken.ledger.timeline`): detection,
                     decision, last_words, stopping, placement (less the wait below),
                     process_start, communication_rebuild, state_transfer, first_step; none
                     for an incident after which training went on (nothing to recover), and
                     no detection for a sub-health fault (training goes on while it is seen)
rescheduling_wait    the part of an incident's placement after a pod was found unschedulable
unfinished           an incident's time after its last recorded phase, while it is still open
                     or when the job gave up
checkpoint_save      periodic checkpoints outside incidents, when recorded (``CheckpointSaved``)
stress_test          online stress tests (``StressTestFinished``): the ranks stopping and the
                     test; then the rejoin when it found nothing, while a fault it found is an
                     incident of its own from the verdict on
recomputed_steps     steps trained again after a recovery (the incident's recomputed steps
                     times the median step time): training time that did not advance the model
===================  =====================================================================

Everything else is productive training. ETTR (effective training time ratio) is productive
time over wall time. The in-flight part of the step a fault interrupted counts as productive:
the ledger does not record when that step began. Pure: records and the clock in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from unbroken.ledger.events import (
    CheckpointSaved,
    FirstStepCommitted,
    JobFailed,
    JobStopped,
    JobSubmitted,
    JobSucceeded,
    StepProgress,
    StressTestFinished,
)
from unbroken.ledger.store import Record
from unbroken.ledger.timeline import IncidentOutcome, IncidentTimeline, incidents

#: Causes of badput, in the order a run meets them.
CAUSES: tuple[str, ...] = (
    "startup",
    "checkpoint_save",
    "stress_test",
    "detection",
    "decision",
    "last_words",
    "stopping",
    "placement",
    "rescheduling_wait",
    "device_memory_wait",
    "process_start",
    "communication_rebuild",
    "state_transfer",
    "first_step",
    "recomputed_steps",
    "unfinished",
)

#: The words a person reads for each cause.
CAUSE_LABELS: dict[str, str] = {
    "startup": "startup",
    "checkpoint_save": "checkpoint saves",
    "stress_test": "stress tests",
    "detection": "detection",
    "decision": "decision",
    "last_words": "last words",
    "stopping": "stopping",
    "placement": "placement",
    "rescheduling_wait": "waiting for rescheduling",
    "device_memory_wait": "waiting for device memory",
    "process_start": "process start",
    "communication_rebuild": "communication rebuild",
    "state_transfer": "state transfer",
    "first_step": "first step after recovery",
    "recomputed_steps": "recomputed steps",
    "unfinished": "recovery not finished",
}

# incident phase (timeline.PHASES) -> cause
_CAUSE_OF_PHASE: dict[str, str] = {
    "detect": "detection",
    "decide": "decision",
    "last_words": "last_words",
    "stop": "stopping",
    "place": "placement",
    "device_memory": "device_memory_wait",
    "processes": "process_start",
    "communication": "communication_rebuild",
    "state": "state_transfer",
    "first_step": "first_step",
}


#: The kinds that end a run.
_ENDS = (JobSucceeded.kind, JobFailed.kind, JobStopped.kind)


@dataclass(frozen=True)
class Goodput:
    """A run's wall time split into productive training and badput by cause (seconds)."""

    started_at: float
    ended_at: float
    finished: bool  # the job succeeded or failed (else: still running, or stopped)
    productive_s: float
    badput_s: Mapping[str, float]  # every cause of CAUSES, in that order, zeros included
    step: int  # the last committed step the ledger knows
    step_time_s: float | None  # median of the recorded step times

    @property
    def wall_s(self) -> float:
        return max(0.0, self.ended_at - self.started_at)

    @property
    def ettr(self) -> float | None:
        """Effective training time ratio: productive / wall (None before any wall time)."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    @property
    def lost_s(self) -> float:
        return sum(self.badput_s.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "finished": self.finished,
            "wall_s": self.wall_s,
            "productive_s": self.productive_s,
            "ettr": self.ettr,
            "badput_s": dict(self.badput_s),
            "step": self.step,
            "step_time_s": self.step_time_s,
        }


def goodput(records: Iterable[Record], now: float | None = None) -> Goodput:
    """The goodput of the run in ``records``. ``now`` ends a run that has not finished (a live
    run); without it such a run ends at its last record."""
    recs = sorted(records, key=lambda r: r.id)
    if not recs:
        t = 0.0 if now is None else now
        return Goodput(t, t, False, 0.0, dict.fromkeys(CAUSES, 0.0), 0, None)
    submitted = [r.at for r in recs if r.kind == JobSubmitted.kind]
    start = submitted[0] if submitted else recs[0].at
    ends = [r.at for r in recs if r.kind in _ENDS]
    finished = bool(ends)
    end = ends[0] if ends else (now if now is not None else recs[-1].at)
    end = max(end, start)

    spans: list[tuple[float, float, str]] = []
    found = incidents(recs)
    first_fault = found[0].fault_at if found else None
    first_commit = next((r.at for r in recs if r.kind == FirstStepCommitted.kind), None)
    startup_end = min(t for t in (first_commit, first_fault, end) if t is not None)
    spans.append((start, startup_end, "startup"))
    unschedulable = [r.at for r in recs if r.kind == "PodUnschedulable"]
    for inc in found:
        spans.extend(_incident_spans(inc, end, unschedulable))
    for r in recs:
        if r.kind == CheckpointSaved.kind and not r.data.get("last_words"):
            took = _number(r.data.get("duration_s"))
            if took is not None and took > 0:
                spans.append((r.at - took, r.at, "checkpoint_save"))
        if r.kind == StressTestFinished.kind:
            paused = _number(r.data.get("paused_s")) or 0.0
            took = paused
            if r.data.get("recovered"):  # from the verdict on, the incident's phases
                took = (_number(r.data.get("stop_s")) or 0.0) + (
                    _number(r.data.get("test_s")) or 0.0
                )
            if took > 0:
                spans.append((r.at - paused, r.at - paused + took, "stress_test"))

    badput = dict.fromkeys(CAUSES, 0.0)
    cursor = start
    for a, b, cause in sorted(spans, key=lambda s: (s[0], CAUSES.index(s[2]))):
        a, b = max(a, cursor), min(b, end)
        if b > a:
            badput[cause] += b - a
            cursor = b
    productive = max(0.0, (end - start) - sum(badput.values()))

    times = sorted(
        t
        for r in recs
        if r.kind == StepProgress.kind
        for t in [_number(r.data.get("step_time_s"))]
        if t is not None and t > 0
    )
    step_time = times[len(times) // 2] if times else None
    step = _last_step(recs)
    recomputed = sum(i.steps_recomputed or 0 for i in found)
    if recomputed:
        per_step = step_time if step_time is not None else (productive / step if step else 0.0)
        lost = min(productive, recomputed * per_step)
        badput["recomputed_steps"] += lost
        productive -= lost
    return Goodput(start, end, finished, productive, badput, step, step_time)


def _incident_spans(
    inc: IncidentTimeline, end: float, unschedulable: list[float]
) -> list[tuple[float, float, str]]:
    spans: list[tuple[float, float, str]] = []
    if inc.outcome is IncidentOutcome.WENT_ON:
        return spans
    prev = inc.fault_at
    for phase in inc.phases:
        if phase.ended_at is None:
            continue
        if phase.name == "detect" and inc.source == "sub-health":
            prev = max(prev, phase.ended_at)
            continue
        cause = _CAUSE_OF_PHASE[phase.name]
        if phase.name == "place":
            waited = [t for t in unschedulable if prev <= t <= phase.ended_at]
            if waited:
                spans.append((prev, waited[0], cause))
                spans.append((waited[0], phase.ended_at, "rescheduling_wait"))
                prev = max(prev, phase.ended_at)
                continue
        spans.append((prev, phase.ended_at, cause))
        prev = max(prev, phase.ended_at)
    if inc.outcome is not IncidentOutcome.RECOVERED:
        stop = inc.ended_at if inc.ended_at is not None else end
        spans.append((prev, stop, "unfinished"))
    return spans


def _last_step(recs: list[Record]) -> int:
    kinds = (StepProgress.kind, FirstStepCommitted.kind, *_ENDS)
    step = 0
    for r in recs:
        if r.kind in kinds:
            value = r.data.get("step")
            if isinstance(value, int) and not isinstance(value, bool):
                step = max(step, value)
    return step


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def format_goodput(g: Goodput) -> str:
    """The summary block of ``unbroken events --incidents``."""
    ettr = "-" if g.ettr is None else f"{g.ettr * 100:.1f}%"
    state = "" if g.finished else " (run not finished)"
    lines = [
        f"goodput: ETTR {ettr}, {g.productive_s:.3f} s productive of {g.wall_s:.3f} s wall{state}"
    ]
    for cause in CAUSES:
        took = g.badput_s[cause]
        if took > 0:
            lines.append(f"  {CAUSE_LABELS[cause]:<26}{took:10.3f} s")
    lines.append(f"  {'badput':<26}{g.lost_s:10.3f} s")
    return "\n".join(lines)


def goodput_line(g: Goodput) -> str:
    """One line for ``unbroken status``: ETTR and the largest causes of badput."""
    if g.ettr is None:
        return "-"
    top = sorted(((s, c) for c, s in g.badput_s.items() if s > 0), reverse=True)[:3]
    causes = ", ".join(f"{CAUSE_LABELS[c]} {s:.1f} s" for s, c in top)
    return (
        f"ETTR {g.ettr * 100:.1f}%  ({g.productive_s:.1f} s productive of {g.wall_s:.1f} s"
        + (f"; lost to {causes}" if causes else "")
        + ")"
    )
