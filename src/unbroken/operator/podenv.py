"""The environment the operator gives each pod before it starts.

On top of the container's own env (which wins for anything not listed here as operator-owned):

- **Identity** (always): ``MINDX_TASK_ID`` (the job's id: its name here, the object's uid on
  Kubernetes), ``RANK``, ``GROUP_RANK`` and ``NODE_RANK`` (the pod's node rank: Master 0, then
  the workers in order), ``WORLD_SIZE`` and ``NNODES`` (the number of training pods),
  ``MASTER_ADDR`` (the rank-0 pod's name, which is its host name on Kubernetes; a local runner
  maps it to its own address) and ``MASTER_PORT`` (29500, torchrun's default). These are node-level
  values, as the Ascend Operator sets them: the launcher replaces ``RANK``/``WORLD_SIZE`` with the
  global process values for each training process it starts. A user's ``MASTER_ADDR`` or
  ``MASTER_PORT`` (env or literal launcher option) is honoured.
- **MindSpore**: ``MS_SCHED_HOST``/``MS_SCHED_PORT`` (the scheduler's address: the Scheduler pod,
  else rank 0), ``MS_WORKER_NUM`` (processes in the job), ``MS_LOCAL_WORKER`` (per pod) and
  ``MS_ROLE`` (``MS_SCHED`` or ``MS_WORKER``).
- **Table 3** for the configured strategies (see :mod:`unbroken.spec.injected_env`);
  ``MS_ENABLE_TFT`` is the union of the user's switches and the strategies'.
- **Hot switching** (``subHealthyStrategy: hotSwitch``), as the reference operator does for it:
  ``PROCESS_RECOVER=on`` and ``recover`` in ``HIGH_AVAILABILITY`` (PyTorch), ``ARF:1`` in
  ``MS_ENABLE_TFT`` (MindSpore), on top of the strategies' values: the switch moves a pod's ranks
  by process-level rescheduling while the other pods' processes stay.
- **Watchdog off** for jobs with a process-level strategy or hot switching:
  ``HCCL_ASYNC_ERROR_HANDLING=0``, ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` and
  ``TORCH_NCCL_ENABLE_MONITORING=0``. With these on, a collective that fails because a peer died
  makes the communication library abort the whole process (or its heartbeat monitor kill it), so
  every healthy rank dies with the faulty one and only a full restart is left. Process-level
  recovery needs the healthy processes to survive the failed collective; the agent's hang detection
  and the worker's collective timeouts take the watchdog's place.
- ``TASKD_PROCESS_ENABLE``: ``on`` when the job uses process-level recovery or ``hotSwitch``,
  ``off`` otherwise, unless the user set it (the seed asks users to write it by hand; the
  operator derives it).
"""

from __future__ import annotations

from unbroken.spec import JobSpec, ReplicaSpec, ReplicaType
from unbroken.spec.envknobs import TftSwitch, format_ms_enable_tft, parse_ms_enable_tft
from unbroken.spec.injected_env import injected_env
from unbroken.spec.knobs import Framework, Strategy, SubHealthyStrategy

DEFAULT_MASTER_PORT = 29500
WATCHDOG_OFF = {
    "HCCL_ASYNC_ERROR_HANDLING": "0",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
    "TORCH_NCCL_ENABLE_MONITORING": "0",
}


def process_rungs(job: JobSpec) -> tuple[Strategy, ...]:
    return tuple(s for s in job.fault_handling.strategies if s is not Strategy.EXIT)


def master_address(job: JobSpec) -> tuple[str, int]:
    """Where rank 0 listens: a user's choice if given, else the rank-0 pod and 29500."""
    addr: str | None = None
    port: int | None = None
    for replica in job.replica_specs:
        addr = addr or replica.env.get("MASTER_ADDR") or replica.launcher.master_addr
        if port is None and replica.launcher.master_port is not None:
            port = replica.launcher.master_port
        if port is None and replica.env.get("MASTER_PORT", "").isdigit():
            port = int(replica.env["MASTER_PORT"])
    if addr is None:
        first = next((r for r in job.replica_specs if r.trains), None)
        addr = f"{job.name}-{first.name}-0" if first is not None else job.name
    return addr, port if port is not None else DEFAULT_MASTER_PORT


def pod_env(job: JobSpec, replica: ReplicaSpec, node_rank: int | None) -> dict[str, str]:
    """The full environment of one pod of ``replica`` (``node_rank`` None for a Scheduler)."""
    fault_handling = job.fault_handling
    env = dict(replica.env)
    addr, port = master_address(job)
    env["MINDX_TASK_ID"] = job.name
    if node_rank is not None:
        for name in ("RANK", "GROUP_RANK", "NODE_RANK"):
            env[name] = str(node_rank)
    env["WORLD_SIZE"] = str(job.nodes)
    env["NNODES"] = str(job.nodes)
    env["MASTER_ADDR"] = addr
    env["MASTER_PORT"] = str(port)
    if job.framework is Framework.MINDSPORE:
        scheduler = next((r for r in job.replica_specs if r.type is ReplicaType.SCHEDULER), None)
        env["MS_SCHED_HOST"] = f"{job.name}-{scheduler.name}-0" if scheduler else addr
        env["MS_SCHED_PORT"] = str(port)
        env["MS_WORKER_NUM"] = str(job.world_size)
        env["MS_LOCAL_WORKER"] = str(replica.launcher.nproc_per_node)
        env["MS_ROLE"] = "MS_SCHED" if replica.type is ReplicaType.SCHEDULER else "MS_WORKER"
    injected = injected_env(
        fault_handling.strategies, job.framework, fault_handling.pod_rescheduling
    )
    hot_switch = fault_handling.sub_healthy is SubHealthyStrategy.HOT_SWITCH
    if hot_switch:
        injected.update(hot_switch_env(injected, job.framework))
    user_tft = replica.env.get("MS_ENABLE_TFT")
    if "MS_ENABLE_TFT" in injected and user_tft is not None:
        merged = parse_ms_enable_tft(user_tft)
        merged.update(parse_ms_enable_tft(injected["MS_ENABLE_TFT"]))
        injected["MS_ENABLE_TFT"] = format_ms_enable_tft(merged)
    env.update(injected)
    rungs = process_rungs(job)
    if rungs or hot_switch:
        env.update(WATCHDOG_OFF)
    if "TASKD_PROCESS_ENABLE" not in replica.env:
        env["TASKD_PROCESS_ENABLE"] = "on" if rungs or hot_switch else "off"
    return dict(sorted(env.items()))


#: ``HIGH_AVAILABILITY`` values in the strategies' priority order.
_HA_ORDER = ("retry", "recover", "elastic-training", "dump")


def hot_switch_env(injected: dict[str, str], framework: Framework) -> dict[str, str]:
    """What hot switching adds to the strategies' variables ``injected`` (the reference
    operator's process-recovery environment for a ``hotSwitch`` job)."""
    out = {"PROCESS_RECOVER": "on"}
    if framework is Framework.PYTORCH:
        values = {v for v in injected.get("HIGH_AVAILABILITY", "").split(",") if v}
        values.add("recover")
        out["HIGH_AVAILABILITY"] = ",".join(v for v in _HA_ORDER if v in values)
    else:
        tft = injected.get("MS_ENABLE_TFT")
        switches = parse_ms_enable_tft(tft) if tft else {}
        switches[TftSwitch.ARF] = True
        out["MS_ENABLE_TFT"] = format_ms_enable_tft(switches)
    return out
