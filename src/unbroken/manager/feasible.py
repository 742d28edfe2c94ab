"""What is possible now, as the policy needs it when a fault comes (:class:`Feasibility`).

Unbroken assumes data parallelism: every rank holds a full replica of the model and optimizer
(DDP), or the same shard as a rank of another replica group. A replica of the lost state exists
when a rank outside the fault is alive and every worker can recover in process (its heartbeat
says so). Such workers never apply half a step: a failed collective skips the optimizer update,
an update that raised marks the rank suspect, and the repair takes the most advanced replica and
checks that every rank agrees (step and state digest) before training resumes; so "outside the
optimizer update" holds whenever in-process recovery does. A rank that never wrote a heartbeat
record has no session (a plain torchrun script): nothing of it can be repaired in process.
"""

from __future__ import annotations

from collections.abc import Sequence

from unbroken.faults import Fault
from unbroken.manager.generations import Generations
from unbroken.manager.inprocess import InProcess
from unbroken.manager.layout import JobLayout
from unbroken.manager.pool import Pool
from unbroken.manager.scaling import Elastic
from unbroken.manager.switches import switched
from unbroken.policy import Feasibility
from unbroken.spec.knobs import Framework

#: Why ranks without an Unbroken session cannot be repaired in process (a plain torchrun
#: script: unbroken.manager.sessionless).
NO_SESSION = (
    "have no Unbroken session (the script has not called unbroken.worker.init): "
    "no heartbeat steps, no replica to repair from"
)


#: Why a MindSpore job's ranks cannot be repaired in process (unbroken.mindspore.session).
MINDSPORE_RANKS = (
    "MindSpore ranks cannot leave a broken communicator and join a new one in a live process "
    "(MindSpore's dynamic-cluster recovery runs on GPUs in graph mode only): every rank restarts"
)


def feasibility(
    job: JobLayout,
    faults: Sequence[Fault],
    now: float,
    *,
    generations: Generations,
    inprocess: InProcess,
    elastic: Elastic,
    pool: Pool,
) -> Feasibility:
    """What the rungs can do for ``faults`` now: in-process repair, a spare node, the pods
    placed elsewhere or pending for room, elastic scale-in; and why not, where known."""
    process_off = ""
    recoverable = inprocess.recoverable()
    if inprocess.label.paused:
        process_off = f"process-recover-enable is pause ({inprocess.label.paused})"
    elif generations.diverged:
        process_off = "replicas diverged, so no replica can be trusted"
    elif job.framework is Framework.MINDSPORE:
        process_off = MINDSPORE_RANKS
    elif not recoverable:
        ranks = generations.ranks
        no_session = sorted(r for r, v in ranks.items() if not v.session)
        off = sorted(r for r, v in ranks.items() if v.session and not v.recoverable)
        if no_session:
            process_off = f"rank(s) {some(no_session)} {NO_SESSION}"
        elif off:
            process_off = (
                f"rank(s) {some(off)} cannot be repaired in process (their "
                "logs say why: no DDP model, one rank, or a DDP configuration it refuses)"
            )
    in_process = not process_off and recoverable and inprocess.healthy_rank_left(faults)
    elastic_off = elastic.refusal(faults) or ""
    pods = {f.pod for f in faults if f.pod is not None}
    return Feasibility(
        process_off=process_off,
        replica_for_lost_state=in_process,
        outside_update=in_process,
        spare_node_free=pool.spare_node_free(max(1, len(pods))),
        fault_age_s=max(0.0, now - min(f.at for f in faults)),
        rank0_pod_faulty=job.pod_of_rank(0) in pods,
        pod_schedulable=pool.schedulable(faults),
        pod_may_pend=pool.may_pend(faults),
        elastic_possible=in_process and not elastic_off,
        elastic_off=elastic_off,
        switched_off=switched(inprocess.engine.pods.values()),
    )


def some(items: Sequence[int], shown: int = 16) -> str:
    """``items`` for a reason: the first ``shown`` and how many in all (a decision's reason at
    10k nodes listed 300 ranks)."""
    head = ", ".join(map(str, items[:shown]))
    return head if len(items) <= shown else f"{head}, ... ({len(items)} in all)"
