"""Faults as the run records them, and the incident being recovered: one owner.

A fault is escalated (a device's repeated faults), numbered, recorded in the ledger and shown;
the first one since training last ran undisturbed opens the *incident*, which the rungs carry
out (``strategy``) and which ends with the first step committed after it
(:meth:`Incidents.recovered`; for a job without a session, once its ranks started again,
:meth:`Incidents.restarted`) or when the policy needs no recovery (:meth:`Incidents.dismiss`).
Every other part asks this one; none writes the incident itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from unbroken.faults import Fault, FaultKind, escalate
from unbroken.ledger import FaultDetected, RecoveryCompleted
from unbroken.manager.context import Context


@dataclass
class Incident:
    """``strategy``: the rung carrying it out now; ``awaiting_replacement``: the pods whose
    replacements (``recover``) the policy is told about once all their ranks started."""

    fault_id: str
    fault: Fault
    step_at_fault: int
    strategy: str = ""
    awaiting_replacement: set[str] = field(default_factory=set)


class Incidents:
    """Every fault of the run (``history``), their count, the recoveries done, and the open
    incident (``open``; None while training runs undisturbed)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.history: list[Fault] = []
        self.n_faults = 0
        self.n_recoveries = 0
        self.open: Incident | None = None

    def record(self, fault: Fault, now: float, newest_step: int) -> Fault:
        """Record ``fault`` (escalated first when it is a device's) as found at ``now``; the
        step is the one the rank said it failed, else ``newest_step`` (reports of commits may
        still be on their way when a fault is detected at once). Returns the fault as
        recorded; the first fault since training last ran undisturbed opens the incident."""
        ctx = self.ctx
        if fault.kind in (FaultKind.DEVICE, FaultKind.DEVICE_MEMORY, FaultKind.STRESS_TEST):
            fault = escalate(fault, self.history, now, ctx.codes)
        self.history.append(fault)
        self.n_faults += 1
        step = fault.step if fault.step is not None else newest_step
        fault_id = f"f{self.n_faults}"
        ctx.ledger.record(
            FaultDetected(
                fault_id=fault_id,
                source=str(fault.kind),
                code=fault.code,
                level=str(fault.level),
                occurred_at=fault.at,
                step=step,
                pods=(fault.pod,) if fault.pod else (),
                nodes=(fault.node,) if fault.node else (),
                ranks=fault.ranks,
                detail=fault.detail[-2000:],
            ),
            at=now,
        )
        ctx.console.line(
            f"fault {fault_id}: {fault.describe()}"
            + (f": {fault.detail.splitlines()[0]}" if fault.detail else "")
        )
        if self.open is None:
            self.open = Incident(fault_id=fault_id, fault=fault, step_at_fault=step)
        return fault

    def newest_of_device(self, node: str, device: int) -> Fault | None:
        """The newest fault recorded on ``device`` of ``node``."""
        return next(
            (f for f in reversed(self.history) if f.node == node and f.device == device), None
        )

    @property
    def fault_id(self) -> str:
        """The open incident's fault id ("" when none is open)."""
        return self.open.fault_id if self.open is not None else ""

    def carried_out_by(self, strategy: str) -> None:
        """The open incident (if any) is now carried out by ``strategy``."""
        if self.open is not None:
            self.open.strategy = strategy

    def await_replacements(self, pods: Iterable[str]) -> None:
        """The open incident's recovery waits for these replacement pods' ranks to start."""
        if self.open is not None:
            self.open.awaiting_replacement = set(pods)

    def replacement_started(self, pod: str) -> bool:
        """``pod``'s ranks started; True when it was the last replacement awaited."""
        awaiting = self.open.awaiting_replacement if self.open is not None else set()
        if pod not in awaiting:
            return False
        awaiting.discard(pod)
        return not awaiting

    def dismiss(self) -> None:
        """The fault needed no recovery (recorded, ignored, or a hot switch not possible or
        given up): training goes on and no incident is open."""
        self.open = None

    def restarted(self, generation: int, at: float) -> None:
        """The open incident of a job without an Unbroken session ended: every rank of
        ``generation`` had started at ``at`` (no step of such a job is seen, so the time is
        until then, and no step count is known)."""
        inc = self.open
        assert inc is not None
        self.open = None
        self.n_recoveries += 1
        took = at - inc.fault.at
        self.ctx.ledger.record(
            RecoveryCompleted(
                fault_id=inc.fault_id,
                strategy=inc.strategy,
                generation=generation,
                step=inc.step_at_fault,
                phases_s={"restart": took},
            ),
            at=at,
        )
        self.ctx.console.line(
            f"recovered from {inc.fault_id} by {inc.strategy}: every rank started again "
            f"{took:.2f} s after the fault, generation {generation} (no session: the steps "
            "it redoes are not seen)"
        )

    def recovered(self, generation: int, first: int, resumed: int, at: float) -> None:
        """The open incident ended: ``generation`` committed step ``first`` at ``at``, having
        resumed at step ``resumed``."""
        inc = self.open
        assert inc is not None
        self.open = None
        self.n_recoveries += 1
        mttr = at - inc.fault.at
        self.ctx.ledger.record(
            RecoveryCompleted(
                fault_id=inc.fault_id,
                strategy=inc.strategy,
                generation=generation,
                step=first,
                phases_s={"mttr": mttr},
            ),
            at=at,
        )
        lost = max(0, inc.step_at_fault - resumed)
        self.ctx.console.line(
            f"recovered from {inc.fault_id} by {inc.strategy}: MTTR {mttr:.2f} s, "
            f"{lost} steps recomputed, generation {generation}"
        )
