"""``process-recover-enable`` as the run moves it: ``on``, ``pause`` while a fault is rescheduled.

The seed defines ``pause`` as "temporarily disable process-level rescheduling and process-level
online recovery". The reference's ClusterD sets the label to ``pause`` itself when a fault falls
to rescheduling (pods deleted and placed again, by the scheduler), and back to ``on`` when the
rescheduled job's processes register again. Unbroken does the same within a run: a job whose
process-level rungs are on pauses them when a decision reschedules pods or the whole job, and
turns them on again when the generation the rescheduling began commits its first step on every
rank. Meanwhile a new fault is offered no process-level rung (a replacement half started has
nothing to repair in process from), and its decision says why (``process-recover-enable is
pause``). Each flip is recorded (``ProcessRecoverPaused``, ``ProcessRecoverResumed``) and shown.
A job configured ``pause`` or ``off`` by its user is not moved.
"""

from __future__ import annotations

from unbroken.ledger import ProcessRecoverPaused, ProcessRecoverResumed
from unbroken.manager.context import Context


class RecoverLabel:
    """The run's ``process-recover-enable``: ``on`` unless paused by a rescheduling."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        #: Why the label is ``pause`` now ("": it is not), and since when.
        self.paused = ""
        self._paused_at = 0.0

    @property
    def value(self) -> str:
        """The label as the run has it now."""
        if self.paused:
            return "pause"
        return str(self.ctx.fh.process_recover)

    def rescheduling(self, what: str, fault_id: str | None, now: float) -> None:
        """A decision reschedules (``what``: ``pod-rescheduling``, ``job-rescheduling``)."""
        if self.paused or not self.ctx.fh.process_level:
            return
        fault = fault_id or "a fault"
        self.paused = f"set when {fault} went to {what}; on again once the job trains"
        self._paused_at = now
        self.ctx.ledger.record(ProcessRecoverPaused(fault_id=fault_id or "", rescheduling=what))
        self.ctx.console.line(
            f"process-recover-enable: on -> pause ({fault} goes to {what}; the process-level "
            "rungs are off until the rescheduled job trains)"
        )

    def committed(self, generation: int, at: float) -> None:
        """Generation ``generation`` committed its first step on every rank."""
        if not self.paused:
            return
        self.paused = ""
        paused_s = max(0.0, at - self._paused_at)
        self.ctx.ledger.record(ProcessRecoverResumed(generation=generation, paused_s=paused_s))
        self.ctx.console.line(
            f"process-recover-enable: pause -> on (generation {generation} trains, "
            f"{paused_s:.1f} s after the pause)"
        )
