"""The job's status as ``unbroken status`` and the dashboard show it (one snapshot, written to
the ledger every half second at most, and at the end), the run's outcome, and the request to
stop a run (:class:`StopRequested`, raised by the CLI's signal handler)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from unbroken.ledger import JobPhase, JobStatus, PodStatus
from unbroken.ledger.codec import to_json_value
from unbroken.ledger.store import encode_status
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


class _RowKey(NamedTuple):
    """What a pod's row is made of: its node and devices, its ranks and their processes."""

    node: str
    devices: tuple[int, ...]
    pids: tuple[tuple[int, int], ...]  # (rank, pid), by rank


def _row_key(proc: PodProcess | None, binding: Binding | None) -> _RowKey:
    return _RowKey(
        node=binding.node if binding else "",
        devices=binding.devices if binding else (),
        pids=tuple(sorted(proc.rank_pids.items())) if proc else (),
    )


def _row(name: str, key: _RowKey) -> PodStatus:
    return PodStatus(
        name=name,
        node=key.node,
        devices=key.devices,
        ranks=tuple(r for r, _ in key.pids),
        pids=tuple(p for _, p in key.pids),
    )


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
    with_pods: bool = True,
) -> JobStatus:
    """The status of ``job``: its phase and what it is doing (``ended``: the phase it ended in
    and why; ``incident``: the one being recovered; ``pending_reason``: why pods wait
    to be placed; ``scaled_in``: the elastic job's smaller world), and each pod's node,
    devices and rank processes as they are now (none without ``with_pods``: :class:`StatusText`
    adds them)."""
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
    rows = tuple(
        _row(p.name, _row_key(pods.get(p.name), bindings.get(p.name)))
        for p in (job.pods if with_pods else ())
    )
    return JobStatus(
        job=job.job_id,
        phase=phase,
        generation=generations.current,
        step=step,
        total_steps=job.total_steps,
        pods=rows,
        started_at=started_at,
        updated_at=now,
        faults=faults,
        recoveries=recoveries,
        message=message,
    )


#: Where a snapshot's pods go in its JSON text: the first key after the plain fields before it
#: (``job``'s value is a JSON string, whose quotes are escaped, so it cannot hold this).
_PODS = '"pods":[]'


class StatusText:
    """The status snapshot as the ledger stores it (``encode_status``'s JSON, byte for byte),
    made incrementally: a pod's row is encoded once and kept until its node, devices or
    processes change. Re-encoding every row took a 10k-node job's manager 0.5-1.5 s every
    10 s, its loop and the control server stopped meanwhile (bench/scale.py: the manager
    "did not run" for 1-2 s, a node's loss found 4 s after it instead of 2 s); a steady
    snapshot now looks at each pod's key only."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[_RowKey, str]] = {}

    def text(
        self,
        status: JobStatus,
        job: JobLayout,
        pods: Mapping[str, PodProcess],
        bindings: Mapping[str, Binding],
    ) -> str:
        """``status`` (its ``pods`` left empty) with the row of each of ``job``'s pods."""
        rows: list[str] = []
        kept = self._rows
        for name in (p.name for p in job.pods):
            key = _row_key(pods.get(name), bindings.get(name))
            cached = kept.get(name)
            if cached is None or cached[0] != key:
                cached = (key, _dumps(to_json_value(_row(name, key))))
                kept[name] = cached
            rows.append(cached[1])
        head = _dumps(encode_status(status))
        assert _PODS in head
        return head.replace(_PODS, '"pods":[' + ",".join(rows) + "]", 1)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
