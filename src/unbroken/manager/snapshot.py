"""The job's status as ``unbroken status`` and the dashboard show it (one snapshot, written to
the ledger every half second at most, and at the end), the run's outcome, and the request to
stop a run (:class:`StopRequested`, raised by the CLI's signal handler)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from unbroken.ledger import JobPhase, JobStatus, PodStatus
from unbroken.manager.generations import Generations
from unbroken.manager.incident import Incident
from unbroken.manager.layout import JobLayout
from unbroken.manager.pods import PodProcess
from unbroken.scheduler import Binding


@dataclass
class RunOutcome:
    """How a run ended: succeeded or not and why, at which step, after how many faults and
    recoveries, how long it took."""

    succeeded: bool
    reason: str
    step: int
    faults: int
    recoveries: int
    elapsed_s: float
    stopped_by: str = ""  # the signal that stopped the run ("": it ended by itself)

    @property
    def phase(self) -> JobPhase:
        if self.stopped_by:
            return JobPhase.STOPPED
        return JobPhase.SUCCEEDED if self.succeeded else JobPhase.FAILED


class StopRequested(KeyboardInterrupt):
    """The user asked the run to stop (``signal``: SIGINT or SIGTERM): raised in the main thread
    by ``unbroken run`` and ``unbroken serve``; the job manager stops every process of the run
    and records the stop (:meth:`unbroken.manager.job.JobManager.run`)."""

    def __init__(self, signal: str) -> None:
        super().__init__(signal)
        self.signal = signal
        #: What the run says of its stop, once recorded ("stopped by SIGINT at step 120").
        self.reason = ""


def job_status(
    job: JobLayout,
    *,
    ended: tuple[JobPhase, str] | None,
    incident: Incident | None,
    pending_reason: str,
    scaled_in: str,
    world_size: int,
    generations: Generations,
    step: int,
    pods: Mapping[str, PodProcess],
    bindings: Mapping[str, Binding],
    started_at: float,
    now: float,
    faults: int,
    recoveries: int,
) -> JobStatus:
    """The status of ``job``: its phase and what it is doing (``ended``: the phase it ended in
    and why; ``incident``: the one being recovered; ``pending_reason``: why pods wait
    to be placed; ``scaled_in``: the elastic job's smaller world), and each pod's node,
    devices and rank processes as they are now."""
    if ended is not None:
        phase = ended[0]
    elif incident is not None:
        phase = JobPhase.RECOVERING
    elif len(generations.ranks) == world_size:
        phase = JobPhase.RUNNING
    else:
        phase = JobPhase.PENDING
    if ended is not None:
        message = ended[1]
    elif pending_reason:
        message = pending_reason
    elif incident is not None:
        message = f"recovering from {incident.fault_id} ({incident.strategy})"
    else:
        message = scaled_in
    rows = []
    for name in (p.name for p in job.pods):
        proc = pods.get(name)
        binding = bindings.get(name)
        pids = proc.rank_pids if proc else {}
        rows.append(
            PodStatus(
                name=name,
                node=binding.node if binding else "",
                devices=binding.devices if binding else (),
                ranks=tuple(sorted(pids)),
                pids=tuple(pids[r] for r in sorted(pids)),
            )
        )
    return JobStatus(
        job=job.job_id,
        phase=phase,
        generation=generations.current,
        step=step,
        total_steps=job.total_steps,
        pods=tuple(rows),
        started_at=started_at,
        updated_at=now,
        faults=faults,
        recoveries=recoveries,
        message=message,
    )
