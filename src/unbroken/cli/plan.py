"""``unbroken plan FILE [--cluster FILE] [--json]``: what the operator will do for a job.

Prints the effective recovery ladder, the modes and their Table 1 parameters, each pod's
environment, ports and launcher line, and every warning; ``--json`` prints the same as one JSON
object for machines. Exit 1 (problems on stderr) when the job or cluster YAML is not valid.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from unbroken.operator import Plan, PodPlan, plan
from unbroken.spec import JobSpec, SpecError, load_cluster, load_job
from unbroken.spec.faulthandling import MINDSPORE_NO_REGROUP as NO_REGROUP
from unbroken.spec.knobs import Framework
from unbroken.spec.launcher import LauncherKind

#: The rungs that keep healthy ranks in their processes, and the state each needs.
IN_PROCESS_RUNGS = ("retry", "recover-in-place", "recover", "dump")
IN_PROCESS_NOTE = (
    "in process only where every rank's state has a replica on another rank, as each rank's "
    "session declares when it starts (its heartbeat's recoverable flag): DDP, HSDP with 2 "
    "or more replica groups and ZeRO with a replica optimizer (dump: DDP only, last words "
    "need the whole state on one rank); FSDP2 with one copy of each shard and ZeRO without "
    "a replica optimizer skip them for the checkpoint rung"
)


#: What each process-level rung does for MindSpore ranks (unbroken.mindspore.session).
MINDSPORE_RUNGS = {
    "retry": "MindSpore ranks redo a step whose device memory (UCE) or link (HCCE) failed, in "
    "their processes; a corrupt rank copies its parameters from a healthy one",
    "dump": "when a rank fails, a healthy MindSpore rank (stopped by the restart, or once its "
    "all-reduce gives up on the dead peer) or the failing rank, when its error left its state "
    "whole, writes the committed state (TTP); every rank resumes from it",
    "recover-in-place": "not for MindSpore ranks: they cannot join a new communicator in a live "
    "process (MindSpore's dynamic-cluster recovery runs on GPUs in graph mode only); every rank "
    "restarts from the newest checkpoint or last words",
    "recover": "not for MindSpore ranks (as recover-in-place): every rank restarts",
    "op-retry": "not for MindSpore ranks: their collectives are MindSpore's own, not Unbroken's "
    "re-executable ones; a failed one is redone with its step (retry, HCCE)",
}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show the recovery ladder, each pod's env and every warning for a job",
        description="Show what the operator does for a job before any pod starts.",
    )
    parser.add_argument("file", type=Path, metavar="FILE", help="job YAML")
    parser.add_argument("--cluster", type=Path, metavar="FILE", help="cluster YAML")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        job = load_job(args.file)
        cluster = load_cluster(args.cluster, job)
    except SpecError as err:
        print(str(err), file=sys.stderr)
        return 1
    result = plan(job, cluster)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(render(result))
    return 0


def _launch_line(pod: PodPlan) -> str:
    launcher = pod.launcher
    if launcher.kind is None:
        return "(no launcher line found in the container command)"
    if launcher.wrapper is not None:
        words = ["bash", launcher.wrapper]
    elif launcher.kind is LauncherKind.MSRUN:
        words = [
            "msrun",
            f"--worker_num={launcher.nproc_per_node * launcher.nnodes}",
            f"--local_worker_num={launcher.nproc_per_node}",
            f"--node_rank={launcher.node_rank}",
            f"--master_addr={launcher.master_addr}",
            f"--master_port={launcher.master_port}",
        ]
        words += [f"--{k}={v}" for k, v in launcher.options]
    else:
        words = [str(launcher.kind)]
        words += [
            f"--nproc_per_node={launcher.nproc_per_node}",
            f"--nnodes={launcher.nnodes}"
            if launcher.min_nnodes is None
            else f"--nnodes={launcher.min_nnodes}:{launcher.nnodes}",
            f"--node_rank={launcher.node_rank}",
            f"--master_addr={launcher.master_addr}",
            f"--master_port={launcher.master_port}",
            f"--max_restarts={launcher.max_restarts}",
            f"--monitor_interval={launcher.monitor_interval_s:g}",
        ]
        words += [f"--{k}={v}" for k, v in launcher.options]
    if launcher.script is not None:
        words += [launcher.script, *launcher.script_args]
    return shlex.join(words)


def render(result: Plan) -> str:
    job, cluster, fh = result.job, result.cluster, result.job.fault_handling
    out: list[str] = []
    out.append(
        f"job {job.name} ({job.kind.value}, {job.framework.value}) from {job.source}: "
        f"{job.nodes} nodes x {job.nproc_per_node} processes = world size {job.world_size}"
    )
    spare = cluster.nodes - job.nodes
    out.append(
        f"cluster: {cluster.nodes} nodes ({spare} spare) x {cluster.devices_per_node} devices, "
        f"hotReset {int(cluster.hot_reset)}, listWatchPeriod {cluster.list_watch_period_s:g} s, "
        f"autoStowing {'true' if cluster.auto_stowing else 'false'}"
        + (f", network planes {', '.join(cluster.planes)}" if cluster.planes else "")
        + (f" from {cluster.source}" if cluster.source else " (defaults)")
    )
    out.append("")
    out.append("recovery ladder (tried in this order):")
    for number, rung in enumerate(result.ladder, 1):
        detail = ""
        if rung == "op-retry":
            levels = ", ".join(sorted(level.value for level in fh.op_retry.enabled))
            hold_ms, interval_ms = fh.op_retry.hold_s * 1000, fh.op_retry.interval_s * 1000
            detail = (
                f"levels {levels}; MaxCnt {fh.op_retry.max_count}, HoldTime {hold_ms:g} ms, "
                f"IntervalTime {interval_ms:g} ms"
            )
        elif rung == "recover":
            detail = f"waits {fh.wait_reschedule_s:g} s for the replacement pod"
        elif rung == "elastic-training":
            detail = _elastic_detail(result.job)
        elif rung == "job-rescheduling":
            detail = f"fault-scheduling {fh.fault_scheduling.value}"
            if fh.fault_scheduling.value == "grace":
                detail += f", {fh.grace_s:g} s grace"
            detail += f"; fault-retry-times {fh.fault_retry_times}"
        elif rung == "pod-rescheduling":
            detail = "only the faulty pods move; the others restart their processes in place"
        out.append(f"  {number}. {rung}" + (f"  ({detail})" if detail else ""))
    out.append(
        f"  process-recover-enable {fh.process_recover.value}; subHealthyStrategy "
        f"{fh.sub_healthy.value}; decision wait {fh.decision_wait_s:g} s; "
        f"max_restarts {fh.max_restarts}; monitor_interval {fh.monitor_interval_s:g} s"
    )
    in_process = [r for r in result.ladder if r in IN_PROCESS_RUNGS]
    if job.framework is Framework.MINDSPORE:
        in_process = [r for r in in_process if r not in MINDSPORE_RUNGS]
        for rung, note in MINDSPORE_RUNGS.items():
            if rung in result.ladder:
                out.append(f"  {rung}: {note}")
    if in_process:
        out.append(f"  {', '.join(in_process)}: {IN_PROCESS_NOTE}")
    if fh.link_failover and job.framework is Framework.MINDSPORE:
        out.append(
            f"  link failover, online stress tests (TSP): not for MindSpore ranks: {NO_REGROUP}"
        )
    elif fh.link_failover:
        out.append(
            "  link failover on: the collectives move to the next network plane when theirs "
            "fails or is slow (planes: the cluster YAML's planes, or unbroken launch --join "
            "--plane NAME=IFNAME)"
        )
    out.append("")
    modes = sorted(
        {r.mode for r in result.required}, key=lambda m: [r.mode for r in result.required].index(m)
    )
    out.append("Table 1 parameters of the chosen modes:" if modes else "no fault-handling modes")
    for mode in modes:
        out.append(f"  {mode.value}:")
        for row in (r for r in result.required if r.mode is mode):
            mark = "ok     " if row.present else "MISSING"
            value = row.value if row.value is not None else "-"
            out.append(f"    {mark} {row.parameter:<32} {value}  ({row.source})")
    out.append("")
    out.append("job labels: " + ", ".join(f"{k}={v}" for k, v in result.labels.items()))
    out.append("")
    out.append("pods:")
    for pod in result.pods:
        rank = f"node rank {pod.node_rank}" if pod.node_rank is not None else "no training ranks"
        out.append(f"  {pod.name}  ({pod.replica_type.value}, {rank}, {pod.devices} devices)")
        out.append(f"    launch: {_launch_line(pod)}")
        ports = ", ".join(f"{p.container_port}/{p.name or '-'}" for p in pod.ports) or "-"
        out.append(f"    ports: {ports}")
        out.append("    env:")
        out.extend(f"      {k}={v}" for k, v in pod.env.items())
    out.append("")
    if result.warnings:
        out.append("warnings:")
        out.extend(f"  - {w}" for w in result.warnings)
    else:
        out.append("warnings: none")
    return "\n".join(out)


def _elastic_detail(job: JobSpec) -> str:
    """What the elastic rung can do for ``job``: down to which size, for which faults."""
    nproc = job.nproc_per_node
    if job.min_nodes >= job.nodes:
        return "drops no pod: every Worker replica sets minReplicas to its replicas, or none"
    return (
        f"a lost pod with no node to go to is dropped, down to {job.min_nodes} of {job.nodes} "
        f"pods (world size {job.min_nodes * nproc}-{job.world_size}), never the rank-0 pod; "
        "the others regroup in their processes; scales out when a node is free; the same "
        "model at every size with virtual ranks (unbroken.worker.init(virtual_ranks=...))"
    )
