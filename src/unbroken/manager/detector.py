"""Fault detection: agents' reports and device events in, :class:`~unbroken.faults.Fault`
values out. Pure: no clock (``now`` is an argument), no I/O.

Every fault the job manager hands to the policy is built here, from a typed report
(:mod:`unbroken.protocol.messages`), so its kind comes as data from the detector that saw it:

- a rank exit (:class:`RankExited`): killed by a signal (``process-exit``, ``signal:NAME``),
  raised an exception (``exception``, the exception's class name: ``ReplicasDiverged`` when the
  replicas' agreement check failed), a device error (its code, ``CUDA-710``, of the kind and
  level the code table gives it), or exited with a status (``process-exit``, ``exit:N``);
- a step failure of a live rank (:class:`RankFailed`): the rank's heartbeat says which
  (:class:`~unbroken.protocol.kinds.StepFailure`); a device memory error is retryable, a failed
  update is an exception;
- a hang (:class:`RankHung`), a lost node (its agent fell silent), a device fault from the
  health provider (on a device no rank of the job runs on: :class:`IdleDeviceFault`).

Echoes. When a rank dies, its peers' collectives fail too: they exit having said that a
collective failed under them (their exit report; the agent sets ``peer_failure``) or, when they
can recover in process, report a failed collective. Those ranks did nothing wrong and must
not be blamed: their reports are *held* (:meth:`Detector.settle`) for ``settle_s`` so that the
first fault, the peer's death, is the one handled; when it comes, the echoes are dropped with
it. Only echoes and no cause after the wait (or, while an agent is silent, after the time it
takes to declare its node lost): the first echo is the fault (a collective failed with every
peer alive is a link fault, retryable). During a recovery ranks leave their groups on purpose,
so a failed collective then is no fault.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from unbroken.devices import DeviceFaulted
from unbroken.faults import CodeTable, Fault, FaultKind, FaultLevel
from unbroken.protocol.kinds import DIVERGED_CODE, HEARTBEAT_TIMEOUT_CODE, StepFailure
from unbroken.protocol.messages import RankExited, RankFailed, RankHung

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Where:
    """The pod a report came from and the node it runs on."""

    pod: str
    node: str


@dataclass(frozen=True)
class Held:
    """A fault waiting to settle; ``echo``: possibly the echo of another rank's fault."""

    fault: Fault
    received_at: float
    echo: bool


def _exception_name(traceback_text: str) -> str:
    """The exception class of a traceback's last line (``[rank2]: pkg.Error: text`` ->
    ``Error``)."""
    last = traceback_text.strip().splitlines()[-1]
    if last.startswith("[rank") and "]: " in last:
        last = last.split("]: ", 1)[1]
    name = last.split(":", 1)[0].strip()
    return name.rsplit(".", 1)[-1] if name.replace(".", "").replace("_", "").isalnum() else "error"


def exit_fault(report: RankExited, where: Where, codes: CodeTable) -> Fault:
    """The fault of a rank's unexpected exit."""
    tb = report.traceback
    sig = report.signal
    if sig:
        kind, code = FaultKind.PROCESS_EXIT, f"signal:{sig}"
    elif report.device_code:  # a device error ended it: the code table's row says how bad
        kind, code = codes.kind_for(report.device_code), report.device_code
    elif report.exception:  # the rank said which exception ended it
        kind, code = FaultKind.EXCEPTION, report.exception
    elif "Traceback (most recent call last)" in tb:  # a script without the worker API
        kind, code = FaultKind.EXCEPTION, _exception_name(tb)
    else:
        kind, code = FaultKind.PROCESS_EXIT, f"exit:{report.returncode}"
    last = tb.strip().splitlines()[-1] if tb.strip() and not sig else ""
    how = (
        f"killed by {sig}"
        if sig
        else "raised an exception"
        if report.ended_after_failure
        else f"exited {report.returncode}"
    )
    return Fault(
        kind=kind,
        level=codes.level_for(kind, code),
        code=code,
        at=report.exited_at,
        node=where.node,
        pod=where.pod,
        ranks=(report.rank,),
        detail=f"rank {report.rank} (pid {report.pid}) {how}" + (f": {last}" if last else ""),
    )


def diverged(fault: Fault) -> bool:
    """Whether ``fault`` is the replicas' agreement check failing: no replica can be trusted."""
    return fault.kind is FaultKind.EXCEPTION and fault.code == DIVERGED_CODE


def step_fault(report: RankFailed, where: Where, codes: CodeTable) -> Fault | None:
    """The fault of a live rank's failed step (None: it reports no failure)."""
    kind = report.failure.kind
    if kind is None:
        return None
    code = report.failure.code
    what = _STEP_FAILURES.get(report.failure, str(report.failure))
    return Fault(
        kind=kind,
        level=codes.level_for(kind, code),
        code=code,
        at=report.failed_at,
        node=where.node,
        pod=where.pod,
        ranks=(report.rank,),
        device=None if report.failure is StepFailure.COLLECTIVE else report.device,
        detail=f"rank {report.rank} (pid {report.pid}) failed step {report.failed_step}: {what}",
        step=report.failed_step,
    )


_STEP_FAILURES = {
    StepFailure.COLLECTIVE: "a collective failed and no peer was lost",
    StepFailure.UPDATE: "its optimizer update raised",
    StepFailure.DEVICE_MEMORY: "device memory error",
    StepFailure.OUT_OF_MEMORY: "a device allocation failed (out of memory)",
}


def hang_fault(report: RankHung, where: Where, codes: CodeTable) -> Fault:
    return Fault(
        kind=FaultKind.HANG,
        level=codes.level_for(FaultKind.HANG, HEARTBEAT_TIMEOUT_CODE),
        code=HEARTBEAT_TIMEOUT_CODE,
        at=report.last_tick_at,
        node=where.node,
        pod=where.pod,
        ranks=(report.rank,),
        detail=f"rank {report.rank} (pid {report.pid}) silent for {report.silent_s:.2f} s "
        f"(timeout {report.timeout_s:.2f} s)",
    )


def node_lost_fault(
    where: Where, ranks: tuple[int, ...], last_heard_at: float, why: str, codes: CodeTable
) -> Fault:
    return Fault(
        kind=FaultKind.NODE_LOST,
        level=codes.level_for(FaultKind.NODE_LOST, HEARTBEAT_TIMEOUT_CODE),
        code=HEARTBEAT_TIMEOUT_CODE,
        at=last_heard_at,
        node=where.node,
        pod=where.pod,
        ranks=ranks,
        detail=f"node {where.node} lost: {why}",
    )


@dataclass(frozen=True)
class IdleDeviceFault:
    """A device that holds no rank of this job failed (a spare node's, or one a pod left):
    training is not touched; an isolating level takes it out of the pool."""

    node: str
    device: int
    code: str
    level: FaultLevel


def device_fault(
    event: DeviceFaulted, holder: tuple[str, int] | None, codes: CodeTable
) -> Fault | IdleDeviceFault:
    """The fault of a device the health provider reports faulty; ``holder``: the pod and rank
    that run on the device (None: no rank of this job)."""
    code = event.code or "unknown"
    kind = codes.kind_for(code)
    level = codes.level_for(kind, code)
    if holder is None:
        return IdleDeviceFault(event.node, event.device, code, level)
    pod, rank = holder
    return Fault(
        kind=kind,
        level=level,
        code=code,
        at=event.occurred_at,
        node=event.node,
        pod=pod,
        ranks=(rank,),
        device=event.device,
        detail=f"device {event.device} of {event.node} reported {code}"
        + (f": {event.detail}" if event.detail else ""),
    )


@dataclass(frozen=True)
class Detector:
    """The faults held back until they settle (see the module docstring)."""

    codes: CodeTable
    settle_s: float
    agent_timeout_s: float
    held: tuple[Held, ...] = ()

    def hold(self, fault: Fault, now: float, *, echo: bool = False) -> Detector:
        return Detector(
            self.codes, self.settle_s, self.agent_timeout_s, (*self.held, Held(fault, now, echo))
        )

    def rank_exited(self, report: RankExited, where: Where, now: float) -> tuple[Detector, Fault]:
        fault = exit_fault(report, where, self.codes)
        return self.hold(fault, now, echo=report.peer_failure), fault

    def rank_failed(
        self,
        report: RankFailed,
        where: Where,
        now: float,
        *,
        recovering: bool,
        generation_began_at: float,
    ) -> Detector:
        """``recovering``: an incident is being recovered; ``generation_began_at``: when the
        current generation began (a failure stamped before it belongs to an older one)."""
        fault = step_fault(report, where, self.codes)
        if fault is None:
            return self
        if report.failure is StepFailure.COLLECTIVE:
            if recovering or report.failed_at < generation_began_at:
                log.info("rank %d: a collective failed during a recovery; not a fault", report.rank)
                return self
            return self.hold(fault, now, echo=True)
        return self.hold(fault, now)

    def rank_hung(self, report: RankHung, where: Where, now: float) -> Detector:
        return self.hold(hang_fault(report, where, self.codes), now)

    def node_lost(
        self, where: Where, ranks: tuple[int, ...], last_heard_at: float, why: str, now: float
    ) -> Detector:
        return self.hold(node_lost_fault(where, ranks, last_heard_at, why, self.codes), now)

    def settle(
        self, now: float, agent_silent: bool, gather_s: float = 0.0
    ) -> tuple[Detector, tuple[Fault, ...]]:
        """The faults to handle now, in the order they came, and what stays held.

        ``agent_silent``: an agent of the job (not yet found lost) has not been heard from for
        a moment; its node may be lost, and that would be the cause of the echoes held.

        A lost node found while another agent is silent is held up to ``gather_s``: the nodes
        of a rack that went at once are found lost a heartbeat interval apart at most, and are
        handed on together, one incident (:meth:`JobManager.faults_detected`), not one fault
        after another, each escalating the one before. A node lost alone is not held."""
        if not self.held:
            return self, ()
        primaries = [h for h in self.held if not h.echo]
        lost_at = [h.received_at for h in primaries if h.fault.kind is FaultKind.NODE_LOST]
        if lost_at and agent_silent and now - min(lost_at) < gather_s:
            return self, ()
        if not primaries:
            first = min(h.received_at for h in self.held)
            wait_s = self.agent_timeout_s + 0.5 if agent_silent else self.settle_s
            if now - first < wait_s:
                return self, ()
            primaries = list(self.held[:1])  # only echoes: a collective failure, cause unseen
        return Detector(self.codes, self.settle_s, self.agent_timeout_s), tuple(
            h.fault for h in primaries
        )


__all__ = [
    "Detector",
    "Held",
    "IdleDeviceFault",
    "Where",
    "device_fault",
    "diverged",
    "exit_fault",
    "hang_fault",
    "node_lost_fault",
    "step_fault",
]
